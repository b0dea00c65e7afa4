-- Reconcile a reservation with the real counts; idempotent (the open-reservation entry is the token).
-- KEYS: 1 open reservations (hash)  2 reservation deadlines (zset)  3 period counter
--       4 TPM bucket the reservation charged
-- ARGV: 1 reservation id  2 real tokens  3 real cost in 1e-8 USD units
-- If the counter was rebuilt from the database since the reservation (other epoch), the
-- reservation is not in it: add the real amounts instead of the difference.
-- Returns 1 when settled now, 0 when it had already been settled (or refunded as stale).
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local rtok, rusd, rtpm, ep = string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+):(.*)$')
local tok, usd = tonumber(ARGV[2]), tonumber(ARGV[3])
local counter_epoch = redis.call('HGET', KEYS[3], 'epoch')
if counter_epoch then
  if counter_epoch == ep then
    redis.call('HINCRBY', KEYS[3], 'tok', tok - tonumber(rtok))
    redis.call('HINCRBY', KEYS[3], 'usd', usd - tonumber(rusd))
  else
    redis.call('HINCRBY', KEYS[3], 'tok', tok)
    redis.call('HINCRBY', KEYS[3], 'usd', usd)
  end
end
local tpm_tok = tonumber(rtpm)
if tpm_tok > 0 and redis.call('EXISTS', KEYS[4]) == 1 then
  local left = tonumber(redis.call('INCRBY', KEYS[4], tok - tpm_tok))
  if left < 0 then redis.call('SET', KEYS[4], 0, 'KEEPTTL') end
end
return 1
