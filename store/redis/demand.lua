-- Claims one replica's part of one rate-limit-quota limit, atomically, so
-- that the parts the replicas hold never sum above the capacity.
--
-- KEYS[1]: the limit's hash, one field per replica:
--   "<unix ms written> <part held> <demand> <demand> ...".
-- ARGV: replica, now (unix ms), stale (ms), capacity, the most this
-- replica may claim, then the demands of its proxies.
--
-- Divides the capacity max-min fairly over the demands of every replica
-- whose field is fresh, grants this replica the sum of its proxies'
-- shares, at most what the others do not hold and the most it may claim,
-- and records the grant as its part. Returns the part granted.
local key, me = KEYS[1], ARGV[1]
local now, stale, cap, most = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local ds, mine = {}, {}
for i = 6, #ARGV do
  ds[#ds + 1] = {tonumber(ARGV[i]), true}
  mine[#mine + 1] = ARGV[i]
end
local others = 0
local h = redis.call('HGETALL', key)
for i = 1, #h, 2 do
  if h[i] ~= me then
    local n, ms, held, rest = 0, nil, nil, {}
    for f in string.gmatch(h[i + 1], '%S+') do
      n = n + 1
      if n == 1 then ms = tonumber(f) elseif n == 2 then held = tonumber(f) else rest[#rest + 1] = tonumber(f) end
    end
    if ms and held and now - ms <= stale then
      others = others + held
      for _, d in ipairs(rest) do
        if d and d >= 0 then ds[#ds + 1] = {d, false} end
      end
    end
  end
end
table.sort(ds, function(a, b) return a[1] < b[1] end)
local left, fair, n = cap, 0, #ds
for k, e in ipairs(ds) do
  local equal = left / (n - k + 1)
  if e[1] <= equal then
    if e[2] then fair = fair + e[1] end
    left = left - e[1]
  else
    for j = k, n do
      if ds[j][2] then fair = fair + equal end
    end
    left = 0
    break
  end
end
-- What the demands leave over is split equally among all proxies.
if left > 0 and n > 0 then fair = fair + left * #mine / n end
local grant = math.max(math.min(fair, most, cap - others), 0)
local v = ARGV[2] .. ' ' .. string.format('%.17g', grant)
if #mine > 0 then v = v .. ' ' .. table.concat(mine, ' ') end
redis.call('HSET', key, me, v)
redis.call('PEXPIRE', key, stale)
return string.format('%.17g', grant)
