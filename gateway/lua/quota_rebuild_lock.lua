-- Who rebuilds a missing period counter: one gateway process at a time. Two processes that found it
-- missing together (a Redis restart under load) both summed the usage rows; the later one's counter
-- write was refused, yet it took its own sum's view of which of its ended requests were counted, and
-- charged some twice: a counter hundreds of tokens over the rows for the rest of the period (found by
-- QA with --workers 2). The process that gets the lock rebuilds; the others wait for the counter.
-- KEYS: 1 period counter   2 the rebuild's lock
-- ARGV: 1 this process's token   2 the lock's time to live (ms)
-- Returns 'done' when the counter is there (made in this run of the Redis server: another process
-- rebuilt it), 'mine' when this process holds the lock (now or already), else 'wait'.
local info = redis.pcall('INFO', 'server')
local run = type(info) == 'string' and string.match(info, 'run_id:(%w+)') or ''
local counter = redis.call('HMGET', KEYS[1], 'tok', 'run')
if counter[1] and (counter[2] or '') == run then return 'done' end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then return 'mine' end
if redis.call('GET', KEYS[2]) == ARGV[1] then return 'mine' end
return 'wait'
