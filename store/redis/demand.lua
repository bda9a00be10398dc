-- Claims one replica's part of one rate-limit-quota limit, atomically, so
-- that the parts the replicas hold never sum above the capacity.
--
-- KEYS[1]: the limit's hash, one field per replica:
--   "<unix ms written> <part held> <demand> <demand> ...", where a demand
--   is "<value>" or "<value>*<count>", count proxies wanting value.
-- ARGV: replica, now (unix ms), stale (ms), capacity, the most this
-- replica may claim, then the demands of its proxies.
--
-- Divides the capacity max-min fairly over the demands of every replica
-- whose field is fresh, grants this replica the sum of its proxies'
-- shares, at most what the others do not hold and the most it may claim,
-- and records the grant as its part. Returns the part granted.
local key, me = KEYS[1], ARGV[1]
local now, stale, cap, most = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
-- Demands are "<value>" or "<value>*<count>" (that many proxies with the
-- same demand). count[v] is how many proxies of the fleet want v.
local count, n = {}, 0
local function add(tok, mine)
  local v, c = string.match(tok, '^([^*]+)%*?(%d*)$')
  v, c = tonumber(v), tonumber(c) or 1
  if v and v >= 0 and c > 0 then
    count[v] = (count[v] or 0) + c
    n = n + c
    if mine then mine[#mine + 1] = {v, c} end
  end
end
local mine = {}
for i = 6, #ARGV do add(ARGV[i], mine) end
local nmine = n
local others = 0
local h = redis.call('HGETALL', key)
for i = 1, #h, 2 do
  if h[i] ~= me then
    local ms, held, rest = string.match(h[i + 1], '^(%d+) (%S+)(.*)$')
    ms, held = tonumber(ms), tonumber(held)
    if ms and held and now - ms <= stale then
      others = others + held
      for tok in string.gmatch(rest, '%S+') do add(tok, nil) end
    end
  end
end
-- The water level: every demand below it is met, the others get it.
local vals = {}
for v in pairs(count) do vals[#vals + 1] = v end
table.sort(vals)
local left, rem, level = cap, n, nil
for _, v in ipairs(vals) do
  if v > left / rem then
    level = left / rem
    break
  end
  left = left - v * count[v]
  rem = rem - count[v]
end
local fair = 0
for _, e in ipairs(mine) do
  fair = fair + e[2] * ((level and e[1] > level) and level or e[1])
end
-- What the demands leave over is split equally among all proxies.
if not level and n > 0 then fair = fair + left * nmine / n end
local grant = math.max(math.min(fair, most, cap - others), 0)
local v = ARGV[2] .. ' ' .. string.format('%.17g', grant)
if #ARGV > 5 then v = v .. ' ' .. table.concat(ARGV, ' ', 6) end
redis.call('HSET', key, me, v)
redis.call('PEXPIRE', key, stale)
return string.format('%.17g', grant)
