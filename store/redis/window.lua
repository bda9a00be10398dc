-- window.lua runs one or more requests, one after the other, each taking
-- one hit on each of several distinct fixed-window keys, every hit vetoing
-- and none saturating (a usual Envoy request): all of a request's hits, or
-- none if one does not fit. Concurrent requests share one call (see
-- combiner); a key may appear in several of them. It is take.lua's batch
-- for that case without the machinery and with as few conversions between
-- numbers and strings as possible (each costs Redis more than a key
-- lookup). States are take.lua's: "end:count", end in Unix seconds.
--
-- ARGV holds, for each request in turn, n, its number of keys, then the 4
-- fields of the hit on each of its n keys (the next n of KEYS): cost (at
-- most limit+1; 0 checks, and fits unless the count is past the limit:
-- store.PeekWithin; strict checks go to take.lua), limit, e, the end of
-- the window holding now, and ttl, the milliseconds from now until a
-- second after e; or, for a key in envoyproxy/ratelimit's layout (store.PlainKeys:
-- the window is in the key's name, the value is the bare count), e is "p"
-- and ttl the milliseconds of the reference's expiry, set at every write
-- as its EXPIRE after each INCRBY.
-- Returns, for each request in turn, 1 if committed, 0 if denied, -1 if
-- left to take.lua, then each key's count in the window ending at e before
-- the request (0 for no key or an older window): integers only, which cost
-- Redis and the caller less than the states. A committed request wrote
-- count + cost to each key of a cost above 0. A request is left to
-- take.lua, writing nothing, if a key holds something else than a window
-- ending at or before e (the caller's clock stepped back, or a value not
-- of this script): so no value fails the call, which Redis would not undo,
-- for the other requests of the call.
local vals = redis.call('MGET', unpack(KEYS))
local written = {} -- key -> the state an earlier request of this call wrote
local out, counts = {}, {}
local k, a, na = 0, 1, #ARGV
while a <= na do
  local n = tonumber(ARGV[a])
  a = a + 1
  local base = #out
  local status = 1
  for i = 1, n do
    local o = a + 4 * (i - 1)
    local cost, limit, e = tonumber(ARGV[o]), tonumber(ARGV[o + 1]), ARGV[o + 2]
    local v = written[KEYS[k + i]]
    if v == nil then v = vals[k + i] end
    local count = 0
    if v and e == 'p' then
      count = tonumber(v)
      if not count then status = -1 break end
      -- (a reference pod's INCRBY counts on past the limit; the bound of
      -- a count here, as take.lua clamps it)
      count = math.min(count, 4294967294)
    elseif v then
      local p = string.find(v, ':', 1, true)
      if not p then status = -1 break end
      local ve = string.sub(v, 1, p - 1)
      if ve == e then
        count = tonumber(string.sub(v, p + 1))
        if not count then status = -1 break end
      else
        local ven = tonumber(ve)
        if not (ven and ven < tonumber(e) and string.find(v, '^%d+$', p + 1)) then status = -1 break end
      end
    end
    out[base + 1 + i], counts[i] = count, count + cost
    -- (A check, cost 0, fits unless the count is past the limit.)
    if not (count <= limit and cost <= limit - count) then status = 0 end
  end
  out[base + 1] = status
  if status == 1 then
    for i = 1, n do
      local o = a + 4 * (i - 1)
      if ARGV[o] ~= '0' then
        local s
        if ARGV[o + 2] == 'p' then
          s = counts[i]
          redis.call('SET', KEYS[k + i], s, 'PX', ARGV[o + 3])
        elseif out[base + 1 + i] > 0 then
          -- (counts below 10^14 concatenate as plain integers)
          s = ARGV[o + 2] .. ':' .. counts[i]
          -- A count of this window was written with its expiry (cheaper).
          redis.call('SET', KEYS[k + i], s, 'KEEPTTL')
        else
          -- The window's first count is the cost, as the caller wrote it:
          -- no number to format (which costs Redis as much as a SET).
          s = ARGV[o + 2] .. ':' .. ARGV[o]
          redis.call('SET', KEYS[k + i], s, 'PX', ARGV[o + 3])
        end
        written[KEYS[k + i]] = s
      end
    end
  elseif status == -1 then
    for i = 1, n do out[base + 1 + i] = 0 end
  end
  k, a = k + n, a + 4 * n
end
return out
