-- Take one request from a moving window and report the window, in one round trip.
-- Same layout as the `limits` package's moving window (the storage slowapi uses): a list of
-- request timestamps, newest first, trimmed to `limit` entries.
-- KEYS: 1 the window list.  ARGV: 1 now (s, float)  2 limit  3 window length (s)
-- Returns {allowed 1|0, requests in the window (after this one), oldest timestamp in the window}
local now, limit, expiry = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local allowed = 0
local edge = redis.call('LINDEX', KEYS[1], limit - 1)
if not (edge and tonumber(edge) >= now - expiry) then
  redis.call('LPUSH', KEYS[1], ARGV[1])
  redis.call('LTRIM', KEYS[1], 0, limit - 1)
  redis.call('EXPIRE', KEYS[1], expiry)
  allowed = 1
end
-- binary search for the oldest entry still inside the window
local low, high, found = 0, redis.call('LLEN', KEYS[1]) - 1, -1
local target = now - expiry
while low <= high do
  local mid = math.floor((low + high) / 2)
  local v = tonumber(redis.call('LINDEX', KEYS[1], mid))
  if v and v >= target then found = mid; low = mid + 1 else high = mid - 1 end
end
if found < 0 then return {allowed, 0, ARGV[1]} end
return {allowed, found + 1, redis.call('LINDEX', KEYS[1], found)}
