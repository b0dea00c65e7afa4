-- Create a period counter (rebuilt from the database) unless another process already did.
-- KEYS: 1 period counter   ARGV: 1 tokens  2 usd units  3 ttl seconds  4 epoch id
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'tok', ARGV[1], 'usd', ARGV[2], 'epoch', ARGV[4])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
