-- Reserve prompt + completion tokens (and money) for a batch of requests of one tenant, atomically,
-- one request after the other exactly as one call each would (gateway.coalesce batches the
-- reservations of one event-loop iteration).
-- KEYS (all under the tenant's hash tag {t:<id>}):
--   1 period counter (hash: tok, usd, epoch)   2 open reservations (hash: id -> "tok:usd:tpm:epoch")
--   3 reservation deadlines (zset: id -> unix time)   4 TPM bucket (this minute)   5 TPM bucket (previous)
-- ARGV: 1 budget_tokens (-1: none)  2 budget_usd in 1e-8 USD units (-1: none)  3 tpm (0: none)
--       4 elapsed fraction of this minute  5 now (unix s)
--       6 deadline (unix s) after which an unsettled reservation is refunded unless its process
--         renews it (its lease)  7 ttl of keys 2, 3 (s)
--       8 1: go on without the counter when it is missing (a tenant without a budget while the
--         counter cannot be rebuilt: nothing to enforce, the spend is counted by the next rebuild)
--       then per request, 6 values: prompt tokens, requested max completion tokens,
--       prompt price (units/token), completion price (units/token), reservation id,
--       min completion tokens that must fit (below that: refused, not clamped; n choices need n,
--       an embedding 0)
-- Returns {-1} when the counter is missing or from an earlier run of Redis (rebuild it from the database, then retry), else the
-- counter's epoch ('' without a counter; settlements are matched against it), then per request
-- 5 values: 1, allowed_completion, tok_after, usd_after, tpm_used_after
--        or -2, tok_used, usd_used, and of those the tokens and money that open reservations hold
--           (requests in flight) (budget exhausted)
--        or -3, tpm_used, previous minute's count, this minute's count, and the TPM tokens open
--           reservations hold (TPM: when it fits again, and whether only requests in flight fill it)
-- What open reservations hold is summed only on a refusal, once per call (one HVALS).
-- A counter made in an earlier run of the Redis server (loaded from a snapshot after a restart) counts
-- as missing: it misses what was spent after it was saved, so it is rebuilt (quota_init.lua).
-- (A server that refuses INFO to scripts gives '' for every run: counters are then trusted as before.)
local counter = redis.call('HMGET', KEYS[1], 'tok', 'usd', 'epoch', 'run')
local info = redis.pcall('INFO', 'server')
local run = type(info) == 'string' and string.match(info, 'run_id:(%w+)') or ''
local counted = counter[1] ~= false and (counter[4] or '') == run
if not counted and ARGV[8] ~= '1' then return {-1} end
local tok_used = counted and tonumber(counter[1]) or 0
local usd_used = counted and tonumber(counter[2]) or 0
local epoch = counted and counter[3] or ''

-- refund reservations whose process stopped renewing their lease (a crashed or killed gateway:
-- a live one pushes its open reservations' deadlines on every lease_s / 4, quota_adopt.lua). The
-- entry stays as a marker, 'stale:<epoch>', for two hours: should its process be alive after all
-- (cut off from Redis for longer than the lease), its settlement adds the real amounts
-- (quota_settle.lua), and its next renewal charges the reservation again. A marker past its own
-- deadline, or a 'settled' one, is dropped.
local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[5], 'LIMIT', 0, 100)
for _, id in ipairs(stale) do
  local v = redis.call('HGET', KEYS[2], id)  -- (below: 0 - x, since Lua's -0 is not an integer to Redis)
  local tok, usd, ep = nil, nil, nil
  if v then tok, usd, ep = string.match(v, '^(%-?%d+):(%-?%d+):%-?%d+:(.*)$') end
  if tok then
    if counted and ep == epoch then
      tok_used = tonumber(redis.call('HINCRBY', KEYS[1], 'tok', string.format('%d', 0 - tonumber(tok))))
      usd_used = tonumber(redis.call('HINCRBY', KEYS[1], 'usd', string.format('%d', 0 - tonumber(usd))))
    end
    redis.call('HSET', KEYS[2], id, 'stale:' .. ep)
    redis.call('ZADD', KEYS[3], tonumber(ARGV[5]) + 7200, id)
  else
    if v then redis.call('HDEL', KEYS[2], id) end
    redis.call('ZREM', KEYS[3], id)
  end
end

local btok, busd, tpm, frac = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tpm_used, cur, prev = 0, 0, 0
if tpm > 0 then
  cur = tonumber(redis.call('GET', KEYS[4]) or '0')
  prev = tonumber(redis.call('GET', KEYS[5]) or '0')
  tpm_used = math.floor(prev * (1 - frac) + cur)
end

-- the tokens, money and TPM tokens that open reservations hold (made before this call, same epoch)
local held = nil
local function in_flight()
  if not held then
    held = {0, 0, 0}
    for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
      local tok, usd, tpm_tok, ep = string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+):(.*)$')
      if tok then
        if counted and ep == epoch then held[1], held[2] = held[1] + tonumber(tok), held[2] + tonumber(usd) end
        held[3] = held[3] + tonumber(tpm_tok)
      end
    end
  end
  return held
end

local out, open, deadlines = {epoch}, {}, {}
local n_out, n_open = 1, 0
local add_tok, add_usd, add_tpm = 0, 0, 0
for base = 9, #ARGV, 6 do
  local prompt, allowed = tonumber(ARGV[base]), tonumber(ARGV[base + 1])
  local pp, cp, minc = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]), tonumber(ARGV[base + 5])
  local code = 1
  if btok >= 0 then
    local rem = btok - tok_used - prompt
    if rem < minc then code = -2
    elseif rem < allowed then allowed = rem end
  end
  if code == 1 and busd >= 0 then
    local rem = busd - usd_used - prompt * pp
    if usd_used >= busd or rem < 0 then code = -2
    elseif cp > 0 then
      local cap = math.floor(rem / cp)
      if cap < minc then code = -2
      elseif cap < allowed then allowed = cap end
    end
  end
  if code == 1 and tpm > 0 then
    local rem = tpm - tpm_used - prompt
    if rem < minc then code = -3
    elseif rem < allowed then allowed = rem end
  end
  if code == -2 then
    local h = in_flight()  -- (this call's own grants are in flight too)
    out[n_out + 1], out[n_out + 2], out[n_out + 3] = -2, tok_used, usd_used
    out[n_out + 4], out[n_out + 5] = h[1] + add_tok, h[2] + add_usd
  elseif code == -3 then
    out[n_out + 1], out[n_out + 2], out[n_out + 3], out[n_out + 4] = -3, tpm_used, prev, cur + add_tpm
    out[n_out + 5] = in_flight()[3] + add_tpm
  else
    local tokens = prompt + allowed
    local usd = math.ceil(prompt * pp + allowed * cp)
    tok_used, usd_used = tok_used + tokens, usd_used + usd
    add_tok, add_usd = add_tok + tokens, add_usd + usd
    local tpm_tokens = 0
    if tpm > 0 then
      tpm_tokens = tokens
      tpm_used = tpm_used + tokens
      add_tpm = add_tpm + tokens
    end
    local id = ARGV[base + 4]
    open[n_open + 1], open[n_open + 2] = id, string.format('%d:%d:%d:%s', tokens, usd, tpm_tokens, epoch)
    deadlines[n_open + 1], deadlines[n_open + 2] = ARGV[6], id
    n_open = n_open + 2
    out[n_out + 1], out[n_out + 2], out[n_out + 3], out[n_out + 4], out[n_out + 5] = 1, allowed, tok_used, usd_used, tpm_used
  end
  n_out = n_out + 5
end

if n_open > 0 then
  if counted then
    redis.call('HINCRBY', KEYS[1], 'tok', string.format('%d', add_tok))
    redis.call('HINCRBY', KEYS[1], 'usd', string.format('%d', add_usd))
  end
  if add_tpm > 0 then
    redis.call('INCRBY', KEYS[4], string.format('%d', add_tpm))
    redis.call('EXPIRE', KEYS[4], 180)
  end
  redis.call('HSET', KEYS[2], unpack(open))
  redis.call('ZADD', KEYS[3], unpack(deadlines))
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[7]))
  redis.call('EXPIRE', KEYS[3], tonumber(ARGV[7]))
end
return out
