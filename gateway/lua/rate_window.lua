-- Take one request from up to two moving windows (the key's and its tenant's), all or nothing,
-- and report each window, in one round trip.
-- Same layout as the `limits` package's moving window (the storage slowapi uses): a list of
-- request timestamps, newest first, trimmed to `limit` entries. Both keys carry the tenant's hash
-- tag, so this works on Redis Cluster.
-- Entries older than the window are popped from the list's old end first (each entry once, so
-- amortised O(1) a request, where a search of a long list costs O(log n) walks of it); that
-- changes nothing `limits` reads: an expired entry never counts and never refuses. When more than
-- a few have expired at once (a burst a minute ago), the rest is cut off in one LTRIM at the
-- boundary a binary search finds, so no call pops a whole burst one entry at a time.
-- A batch of n requests with the same windows (one event-loop iteration's, gateway.coalesce) is
-- taken in one call, one after the other as n calls would: each all or nothing, so the first
-- `taken` get in, where taken = min(n, the room left in the fullest window).
-- KEYS: the windows (1 or 2).  ARGV: 1 now (s, float)  2 window length (s)  3 n  4.. limit of each key
-- Returns {taken, then per key: requests in the window before the batch, and the timestamp whose
-- expiry gives the window room: its oldest (now when it was empty), or, when the window holds more
-- requests than the limit (the limit was lowered), the limit-th newest}
local now, expiry, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local target = now - expiry
local taken = n
local out = {0}
for i, key in ipairs(KEYS) do
  local popped = 0
  while popped < 16 do
    local last = redis.call('LINDEX', key, -1)
    if not last or tonumber(last) >= target then break end
    redis.call('RPOP', key)
    popped = popped + 1
  end
  if popped == 16 then
    local low, high, keep = 0, redis.call('LLEN', key) - 1, -1
    while low <= high do  -- the last entry still inside the window (newest first)
      local mid = math.floor((low + high) / 2)
      if tonumber(redis.call('LINDEX', key, mid)) >= target then keep = mid; low = mid + 1 else high = mid - 1 end
    end
    if keep < 0 then redis.call('DEL', key) else redis.call('LTRIM', key, 0, keep) end
  end
  local count = redis.call('LLEN', key)
  local limit = tonumber(ARGV[3 + i])
  local room = limit - count
  if room < taken then taken = room end
  table.insert(out, count)
  if count == 0 then table.insert(out, ARGV[1])
  elseif count > limit then table.insert(out, redis.call('LINDEX', key, limit - 1))  -- a lowered limit
  else table.insert(out, redis.call('LINDEX', key, -1)) end
end
if taken < 0 then taken = 0 end
if taken > 0 then
  local entries = {}
  for j = 1, taken do entries[j] = ARGV[1] end
  for i, key in ipairs(KEYS) do
    redis.call('LPUSH', key, unpack(entries))
    redis.call('LTRIM', key, 0, tonumber(ARGV[3 + i]) - 1)
    redis.call('EXPIRE', key, expiry)
  end
end
out[1] = taken
return out
