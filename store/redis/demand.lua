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
-- Every fresh demand in one array of numbers (sorted without a
-- comparator function: the fast path), this replica's first.
local all, n = {}, 0
for i = 6, #ARGV do
  n = n + 1
  all[n] = tonumber(ARGV[i])
end
local nmine = n
local others = 0
local h = redis.call('HGETALL', key)
for i = 1, #h, 2 do
  if h[i] ~= me then
    local v = h[i + 1]
    local ms, held, rest = string.match(v, '^(%d+) (%S+)(.*)$')
    ms, held = tonumber(ms), tonumber(held)
    if ms and held and now - ms <= stale then
      others = others + held
      for f in string.gmatch(rest, '%S+') do
        local d = tonumber(f)
        if d and d >= 0 then
          n = n + 1
          all[n] = d
        end
      end
    end
  end
end
-- The water level: every demand below it is met, the others get it.
local mine = {}
for i = 1, nmine do mine[i] = all[i] end
table.sort(all)
local left, level = cap, nil
for k = 1, n do
  local equal = left / (n - k + 1)
  if all[k] > equal then
    level = equal
    break
  end
  left = left - all[k]
end
local fair = 0
for i = 1, nmine do
  if level and mine[i] > level then fair = fair + level else fair = fair + mine[i] end
end
-- What the demands leave over is split equally among all proxies.
if not level and n > 0 then fair = fair + left * nmine / n end
local grant = math.max(math.min(fair, most, cap - others), 0)
local v = ARGV[2] .. ' ' .. string.format('%.17g', grant)
if nmine > 0 then v = v .. ' ' .. table.concat(ARGV, ' ', 6) end
redis.call('HSET', key, me, v)
redis.call('PEXPIRE', key, stale)
return string.format('%.17g', grant)
