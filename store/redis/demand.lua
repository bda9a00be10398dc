-- Claims one replica's part of one rate-limit-quota limit, atomically, so
-- that the parts the replicas hold never sum above the capacity.
--
-- KEYS[1]: the limit's hash, one field per replica:
--   "<unix ms written> <part held> <demand> <demand> ...", where a demand
--   is one proxy's over its recent reports, "<lowest>/<mean>/<peak>" or
--   one value when the three are equal, or "<demand>*<count>", count
--   proxies with that demand.
-- ARGV: replica, now (unix ms), stale (ms), capacity, the most this
-- replica may claim, then the demands of its proxies.
--
-- Finds the water level of the capacity over the proxies of every replica
-- whose field is fresh, as quota.Divider.Level does: the share s at which
-- the proxies' expected usages sum to the capacity, a proxy using
-- q × min(peak, s) + (1 − q) × min(lowest, s), q the fraction that keeps
-- its mean, the lowest and the peak then clamped to the capacity
-- (max-min fairness when every demand is one value); when the
-- means fit, what they leave over is split equally among the proxies.
-- Grants this replica its proxies' expected usages at that level, at most
-- what the others do not hold and the most it may claim, and records the
-- grant as its part. Returns the part granted.
local key, me = KEYS[1], ARGV[1]
local now, stale, cap, most = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
-- demands[tok] = {lowest, peak, q, proxies, of them this replica's}.
local demands, n = {}, 0
local function add(tok, mine)
  local d, c = string.match(tok, '^([^*]+)%*?(%d*)$')
  c = tonumber(c) or 1
  if not d or c <= 0 then return end
  local e = demands[d]
  if not e then
    local lo, m, hi = string.match(d, '^([^/]+)/([^/]+)/([^/]+)$')
    if not lo then lo, m, hi = d, d, d end
    lo, m, hi = tonumber(lo), tonumber(m), tonumber(hi)
    if not (lo and m and hi) then return end
    hi = math.max(hi, 0)
    lo = math.min(math.max(lo, 0), hi)
    m = math.min(math.max(m, lo), hi)
    local q = 1
    if hi > lo then q = (m - lo) / (hi - lo) end
    e = {math.min(lo, cap), math.min(hi, cap), q, 0, 0}
    demands[d] = e
  end
  e[4] = e[4] + c
  n = n + c
  if mine then e[5] = e[5] + c end
end
for i = 6, #ARGV do add(ARGV[i], true) end
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
-- The sum of expected usages is piecewise linear in the level: past a
-- proxy's lowest its usage grows by 1 − q less per unit, past its peak
-- by q less.
local drop, means = {}, 0
for _, e in pairs(demands) do
  local lo, hi, q, c = e[1], e[2], e[3], e[4]
  drop[lo] = (drop[lo] or 0) + c * (1 - q)
  drop[hi] = (drop[hi] or 0) + c * q
  means = means + c * (q * hi + (1 - q) * lo)
end
local level, extra = nil, 0
if means <= cap then
  if n > 0 then extra = (cap - means) / n end
else
  local vals = {}
  for v in pairs(drop) do vals[#vals + 1] = v end
  table.sort(vals)
  local used, at, slope = 0, 0, n
  for _, v in ipairs(vals) do
    local nxt = used + slope * (v - at)
    if nxt >= cap and slope > 0 then
      level = at + (cap - used) / slope
      break
    end
    used, at, slope = nxt, v, slope - drop[v]
  end
  level = level or at
end
local fair = 0
for _, e in pairs(demands) do
  if e[5] > 0 then
    local lo, hi, q = e[1], e[2], e[3]
    if level then lo, hi = math.min(lo, level), math.min(hi, level) end
    fair = fair + e[5] * (q * hi + (1 - q) * lo + extra)
  end
end
local grant = math.max(math.min(fair, most, cap - others), 0)
local v = ARGV[2] .. ' ' .. string.format('%.17g', grant)
if #ARGV > 5 then v = v .. ' ' .. table.concat(ARGV, ' ', 6) end
redis.call('HSET', key, me, v)
redis.call('PEXPIRE', key, stale)
return string.format('%.17g', grant)
