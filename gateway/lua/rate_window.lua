-- Take one request from up to two moving windows (the key's and its tenant's), all or nothing,
-- and report each window, in one round trip.
-- Same layout as the `limits` package's moving window (the storage slowapi uses): a list of
-- request timestamps, newest first, trimmed to `limit` entries. Both keys carry the tenant's hash
-- tag, so this works on Redis Cluster.
-- KEYS: the windows (1 or 2).  ARGV: 1 now (s, float)  2 window length (s)  3.. limit of each key
-- Returns {allowed 1|0, then per key: requests in the window, oldest timestamp in the window}
local now, expiry = tonumber(ARGV[1]), tonumber(ARGV[2])
local allowed = 1
for i, key in ipairs(KEYS) do
  local edge = redis.call('LINDEX', key, tonumber(ARGV[2 + i]) - 1)
  if edge and tonumber(edge) >= now - expiry then allowed = 0 end
end
if allowed == 1 then
  for i, key in ipairs(KEYS) do
    redis.call('LPUSH', key, ARGV[1])
    redis.call('LTRIM', key, 0, tonumber(ARGV[2 + i]) - 1)
    redis.call('EXPIRE', key, expiry)
  end
end
local out = {allowed}
local target = now - expiry
for _, key in ipairs(KEYS) do
  -- binary search for the oldest entry still inside the window
  local low, high, found = 0, redis.call('LLEN', key) - 1, -1
  while low <= high do
    local mid = math.floor((low + high) / 2)
    local v = tonumber(redis.call('LINDEX', key, mid))
    if v and v >= target then found = mid; low = mid + 1 else high = mid - 1 end
  end
  if found < 0 then
    table.insert(out, 0); table.insert(out, ARGV[1])
  else
    table.insert(out, found + 1); table.insert(out, redis.call('LINDEX', key, found))
  end
end
return out
