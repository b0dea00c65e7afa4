-- Release a counter's rebuild lock if this process still holds it (its rebuild done or failed).
-- KEYS: 1 the rebuild's lock   ARGV: 1 this process's token
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
