-- Take one request from up to two moving windows (the key's and its tenant's), all or nothing,
-- and report each window, in one round trip.
-- Same layout as the `limits` package's moving window (the storage slowapi uses): a list of
-- request timestamps, newest first, trimmed to `limit` entries. Both keys carry the tenant's hash
-- tag, so this works on Redis Cluster.
-- Entries older than the window are popped from the list's old end first (each entry once, so
-- amortised O(1) a request, where a search of a long list costs O(log n) walks of it); that
-- changes nothing `limits` reads: an expired entry never counts and never refuses.
-- KEYS: the windows (1 or 2).  ARGV: 1 now (s, float)  2 window length (s)  3.. limit of each key
-- Returns {allowed 1|0, then per key: requests in the window, oldest timestamp in the window}
local now, expiry = tonumber(ARGV[1]), tonumber(ARGV[2])
local target = now - expiry
local allowed = 1
for i, key in ipairs(KEYS) do
  while true do
    local last = redis.call('LINDEX', key, -1)
    if not last or tonumber(last) >= target then break end
    redis.call('RPOP', key)
  end
  if redis.call('LLEN', key) >= tonumber(ARGV[2 + i]) then allowed = 0 end
end
if allowed == 1 then
  for i, key in ipairs(KEYS) do
    redis.call('LPUSH', key, ARGV[1])
    redis.call('LTRIM', key, 0, tonumber(ARGV[2 + i]) - 1)
    redis.call('EXPIRE', key, expiry)
  end
end
local out = {allowed}
for _, key in ipairs(KEYS) do
  local n = redis.call('LLEN', key)
  if n == 0 then
    table.insert(out, 0); table.insert(out, ARGV[1])
  else
    table.insert(out, n); table.insert(out, redis.call('LINDEX', key, -1))
  end
end
return out
