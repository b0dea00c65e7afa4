-- Create a period counter (rebuilt from the database) unless another process already did in this
-- run of the Redis server. A counter from an earlier run (one that Redis loaded from a snapshot or
-- an append-only file after a restart) is replaced: it misses what was spent after it was saved
-- (found by QA: the embedded Redis killed, then started again from its last snapshot, brought back
-- a counter 640 tokens short, and a tenant overspent its budget by that much).
-- KEYS: 1 period counter   ARGV: 1 tokens  2 usd units  3 ttl seconds  4 epoch id
-- (A server that refuses INFO to scripts gives '' for every run: counters are then trusted as before.)
local info = redis.pcall('INFO', 'server')
local run = type(info) == 'string' and string.match(info, 'run_id:(%w+)') or ''
if redis.call('HGET', KEYS[1], 'run') == run then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'tok', ARGV[1], 'usd', ARGV[2], 'epoch', ARGV[4], 'run', run)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
