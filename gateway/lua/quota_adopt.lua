-- Put one process's open reservations back into a period counter that was rebuilt from the usage
-- rows (Redis flushed or restarted, or the counter dropped): the rows of running requests do not
-- exist yet, so without this the rebuilt counter misses what they reserved until they settle, and
-- requests admitted meanwhile overspend by that much (QA: 6% with 8 clients and one FLUSHDB).
-- A reservation already in this counter (its entry carries the counter's epoch) has its lease
-- renewed (its deadline pushed a lease ahead: the process runs this for its open reservations every
-- lease_s / 4, so only a dead process's lapse); one already settled is left alone; any other (its
-- entry gone, from an earlier epoch, or refunded as 'stale:' when its lease lapsed) is charged
-- again, its entry written with this epoch, so its settlement later applies the difference, once.
-- KEYS: 1 period counter   2 open reservations (hash)   3 reservation deadlines (zset)
-- ARGV: 1 lease (s): the deadline is Redis's own time plus this (a call sent before an outage and
--         run after it must not write a deadline already past: found by QA)
--       2 ttl of keys 2, 3 (s), then per reservation 5 values: id, prompt
--       tokens, allowed completion tokens, prompt price, completion price (units/token)
-- Returns the counter's epoch ('' when there is no counter: nothing done)
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then return {''} end
local deadline = tonumber(redis.call('TIME')[1]) + tonumber(ARGV[1])
local add_tok, add_usd, adopted = 0, 0, 0
for base = 3, #ARGV, 5 do
  local id = ARGV[base]
  local v = redis.call('HGET', KEYS[2], id)
  local tpm, ep = '0', nil
  if v then
    if v == 'settled' then ep = epoch
    else
      local rtok, rusd
      rtok, rusd, tpm, ep = string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+):(.*)$')
    end
  end
  if ep == epoch and v and v ~= 'settled' then  -- in the counter already: its lease renewed
    redis.call('ZADD', KEYS[3], 'XX', 'GT', deadline, id)
  elseif ep ~= epoch then
    local prompt, allowed = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
    local tokens = prompt + allowed
    local usd = math.ceil(prompt * tonumber(ARGV[base + 3]) + allowed * tonumber(ARGV[base + 4]))
    add_tok, add_usd, adopted = add_tok + tokens, add_usd + usd, adopted + 1
    redis.call('HSET', KEYS[2], id, string.format('%d:%d:%s:%s', tokens, usd, tpm or '0', epoch))
    redis.call('ZADD', KEYS[3], deadline, id)
  end
end
if adopted > 0 then
  redis.call('HINCRBY', KEYS[1], 'tok', string.format('%d', add_tok))
  redis.call('HINCRBY', KEYS[1], 'usd', string.format('%d', add_usd))
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
  redis.call('EXPIRE', KEYS[3], tonumber(ARGV[2]))
end
return {epoch}
