-- Reserve prompt + completion tokens (and money) for one request, atomically.
-- KEYS (all under the tenant's hash tag {t:<id>}):
--   1 period counter (hash: tok, usd, epoch)   2 open reservations (hash: id -> "tok:usd:tpm:epoch")
--   3 reservation deadlines (zset: id -> unix time)   4 TPM bucket (this minute)   5 TPM bucket (previous)
-- ARGV: 1 budget_tokens (-1: none)  2 budget_usd in 1e-8 USD units (-1: none)  3 tpm (0: none)
--       4 prompt tokens  5 requested max completion tokens  6 prompt price (units/token)
--       7 completion price (units/token)  8 elapsed fraction of this minute  9 reservation id
--       10 now (unix s)  11 deadline (unix s) after which an unsettled reservation is refunded
--       12 min completion tokens that must fit (1, or 0 when 0 were asked)  13 ttl of keys 2, 3 (s)
-- Returns {1, allowed_completion, tok_after, usd_after, tpm_used_after, epoch}
--      or {-1} counter missing (rebuild it from the database, then retry)
--      or {-2, tok_used, usd_used} budget exhausted   or {-3, tpm_used} TPM exhausted
local counter = redis.call('HMGET', KEYS[1], 'tok', 'usd', 'epoch')
if not counter[1] then return {-1} end
local tok_used = tonumber(counter[1])
local usd_used = tonumber(counter[2] or '0')
local epoch = counter[3] or ''

-- refund reservations whose process never settled them (crashed / killed gateway)
local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[10], 'LIMIT', 0, 100)
for _, id in ipairs(stale) do
  local v = redis.call('HGET', KEYS[2], id)  -- (below: 0 - x, since Lua's -0 is not an integer to Redis)
  if v then
    local tok, usd, _, ep = string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+):(.*)$')
    if ep == epoch then
      tok_used = tonumber(redis.call('HINCRBY', KEYS[1], 'tok', 0 - tonumber(tok)))
      usd_used = tonumber(redis.call('HINCRBY', KEYS[1], 'usd', 0 - tonumber(usd)))
    end
    redis.call('HDEL', KEYS[2], id)
  end
  redis.call('ZREM', KEYS[3], id)
end

local btok, busd, tpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local prompt, allowed = tonumber(ARGV[4]), tonumber(ARGV[5])
local pp, cp, frac, minc = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[12])

if btok >= 0 then
  local rem = btok - tok_used - prompt
  if rem < minc then return {-2, tok_used, usd_used} end
  if rem < allowed then allowed = rem end
end
if busd >= 0 then
  local rem = busd - usd_used - prompt * pp
  if usd_used >= busd or rem < 0 then return {-2, tok_used, usd_used} end
  if cp > 0 then
    local cap = math.floor(rem / cp)
    if cap < minc then return {-2, tok_used, usd_used} end
    if cap < allowed then allowed = cap end
  end
end
local tpm_used = 0
if tpm > 0 then
  local cur = tonumber(redis.call('GET', KEYS[4]) or '0')
  local prev = tonumber(redis.call('GET', KEYS[5]) or '0')
  tpm_used = math.floor(prev * (1 - frac) + cur)
  local rem = tpm - tpm_used - prompt
  if rem < minc then return {-3, tpm_used} end
  if rem < allowed then allowed = rem end
end

local tokens = prompt + allowed
local usd = math.ceil(prompt * pp + allowed * cp)
redis.call('HINCRBY', KEYS[1], 'tok', tokens)
redis.call('HINCRBY', KEYS[1], 'usd', usd)
local tpm_tokens = 0
if tpm > 0 then
  tpm_tokens = tokens
  redis.call('INCRBY', KEYS[4], tokens)
  redis.call('EXPIRE', KEYS[4], 180)
end
redis.call('HSET', KEYS[2], ARGV[9], string.format('%d:%d:%d:%s', tokens, usd, tpm_tokens, epoch))
redis.call('ZADD', KEYS[3], ARGV[11], ARGV[9])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[13]))
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[13]))
return {1, allowed, tok_used + tokens, usd_used + usd, tpm_used + tpm_tokens, epoch}
