-- Reconcile reservations with the real counts; idempotent (the open-reservation entry is the token).
-- One call settles a batch of one tenant's reservations that share a period counter and a TPM
-- bucket (gateway.coalesce batches those of one event-loop iteration).
-- KEYS: 1 open reservations (hash)  2 reservation deadlines (zset)  3 period counter
--       4 TPM bucket the reservations charged
-- ARGV: per reservation 4 values: id, real tokens, real cost in 1e-8 USD units, the counter's
--       epoch when it was made ('' without a counter)
-- If the counter was rebuilt from the database since a reservation (other epoch), the
-- reservation is not in it: add the real amounts instead of the difference. A reservation whose
-- entry is gone while the counter's epoch changed was lost with Redis (flushed or restarted while
-- the request ran): the rebuilt counter never saw it, so its real amounts are added too; with the
-- same epoch a missing entry means settled already: nothing is added. A 'stale:<epoch>' entry was
-- refunded when its lease lapsed: its real amounts are added.
-- Returns per reservation 1 when settled now, 0 when it had already been settled.
-- The batch's entries are read with one HMGET and removed with one HDEL and one ZREM: Redis's time
-- per settlement is a third of one lookup and two removals per reservation (bench/settlement.py).
local counter_epoch = redis.call('HGET', KEYS[3], 'epoch')
local ids, n = {}, 0
for i = 1, #ARGV, 4 do
  n = n + 1
  ids[n] = ARGV[i]
end
if n == 0 then return {} end
local entries = redis.call('HMGET', KEYS[1], unpack(ids))  -- one lookup for the batch
local d_tok, d_usd, d_tpm, any_tpm = 0, 0, 0, false
local out, done, gone, n_gone = {}, {}, {}, 0
for j = 1, n do
  local id, i = ids[j], 4 * j - 3
  local v = entries[j]
  if done[id] then v = 'settled' end  -- the same reservation twice in one batch: settled once
  done[id] = true
  if v == 'settled' then  -- a lost reservation settled before (below): once only
    out[j] = 0
  elseif v and string.sub(v, 1, 6) == 'stale:' then
    -- refunded whole when its lease lapsed (quota_reserve.lua), its process alive after all: the
    -- counter holds none of it, so the real amounts are added (a rebuilt counter: likewise, as a
    -- lost reservation's below); kept as 'settled' so that a second settle adds nothing
    if counter_epoch then
      d_tok, d_usd = d_tok + tonumber(ARGV[i + 1]), d_usd + tonumber(ARGV[i + 2])
    end
    redis.call('HSET', KEYS[1], id, 'settled')
    out[j] = 1
  elseif not v then
    local made_in = ARGV[i + 3]
    if counter_epoch and made_in ~= '' and made_in ~= counter_epoch then
      d_tok, d_usd = d_tok + tonumber(ARGV[i + 1]), d_usd + tonumber(ARGV[i + 2])
      -- remembered until the stale sweep of quota_reserve.lua drops it, so a second settle is a no-op
      redis.call('HSET', KEYS[1], id, 'settled')
      redis.call('ZADD', KEYS[2], tonumber(redis.call('TIME')[1]) + 7200, id)
      out[j] = 1
    else
      out[j] = 0
    end
  else
    n_gone = n_gone + 1
    gone[n_gone] = id
    local rtok, rusd, rtpm, ep = string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+):(.*)$')
    local tok, usd = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    if counter_epoch then
      if counter_epoch == ep then
        d_tok, d_usd = d_tok + tok - tonumber(rtok), d_usd + usd - tonumber(rusd)
      else
        d_tok, d_usd = d_tok + tok, d_usd + usd
      end
    end
    local tpm_tok = tonumber(rtpm)
    if tpm_tok > 0 then
      d_tpm, any_tpm = d_tpm + tok - tpm_tok, true
    end
    out[j] = 1
  end
end
if n_gone > 0 then  -- the settled entries leave in one call each (not one per reservation)
  redis.call('HDEL', KEYS[1], unpack(gone))
  redis.call('ZREM', KEYS[2], unpack(gone))
end
if counter_epoch and (d_tok ~= 0 or d_usd ~= 0) then
  redis.call('HINCRBY', KEYS[3], 'tok', string.format('%d', d_tok))
  redis.call('HINCRBY', KEYS[3], 'usd', string.format('%d', d_usd))
end
if any_tpm and d_tpm ~= 0 and redis.call('EXISTS', KEYS[4]) == 1 then
  local left = tonumber(redis.call('INCRBY', KEYS[4], string.format('%d', d_tpm)))
  if left < 0 then redis.call('SET', KEYS[4], 0, 'KEEPTTL') end
end
return out
