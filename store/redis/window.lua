-- window.lua takes one hit on each of several distinct fixed-window keys,
-- every hit vetoing and none saturating, the batch of a usual Envoy
-- request: all of them, or none if one does not fit. It is take.lua's
-- batch for that case without the machinery and with as few conversions
-- between numbers and strings as possible (each costs Redis more than a
-- key lookup). States are take.lua's: "end:count", end in Unix seconds.
--
-- ARGV[4(i-1)+1 ...] are the 4 fields of the hit on KEYS[i]: cost (at most
-- limit+1), limit, e, the end of the window holding now, and ttl, the
-- milliseconds from now until a second after e.
-- Returns {1 if committed else 0, the state of each key before ("" for
-- none)..., the count written to each key, or -1 for a key left as it
-- was...}; or {-1}, writing nothing, if a key holds something else than a
-- window ending at or before e (the caller's clock stepped back): take.lua
-- handles those.
local n = #KEYS
local vals = redis.call('MGET', unpack(KEYS))
local out, counts, ok = {0}, {}, true
for i = 1, n do
  local o = 4 * (i - 1)
  local cost, limit, e = tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), ARGV[o + 3]
  local v, count = vals[i], 0
  if v then
    local p = string.find(v, ':', 1, true)
    if not p then return {-1} end
    local ve = string.sub(v, 1, p - 1)
    if ve == e then
      count = tonumber(string.sub(v, p + 1))
    elseif not (tonumber(ve) < tonumber(e)) then
      return {-1}
    end
    out[1 + i] = v
  else
    out[1 + i] = ''
  end
  counts[i] = count + cost
  if not (limit > 0 and count <= limit and cost <= limit - count) then ok = false end
end
for i = 1, n do
  local o = 4 * (i - 1)
  if ok and ARGV[o + 1] ~= '0' then
    -- (counts below 10^14 concatenate as plain integers)
    redis.call('SET', KEYS[i], ARGV[o + 3] .. ':' .. counts[i], 'PX', ARGV[o + 4])
    out[1 + n + i] = counts[i]
  else
    out[1 + n + i] = -1
  end
end
if ok then out[1] = 1 end
return out
