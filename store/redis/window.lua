-- window.lua runs one or more requests, one after the other, each taking
-- one hit on each of several distinct fixed-window keys, every hit vetoing
-- and none saturating (a usual Envoy request): all of a request's hits, or
-- none if one does not fit. Concurrent requests share one call (see
-- combiner); a key may appear in several of them. It is take.lua's batch
-- for that case without the machinery and with as few conversions between
-- numbers and strings as possible (each costs Redis more than a key
-- lookup). States are take.lua's: "end:count", end in Unix seconds.
--
-- ARGV holds, for each request in turn, n, its number of keys, m, its
-- clock in milliseconds (rounded up), then one field for the hit on each of
-- its n keys (the next n of KEYS): "cost:limit:e", cost at most limit+1 (0
-- checks, and fits unless the count is past the limit: store.PeekWithin;
-- strict checks go to take.lua) and e the end of the window holding now,
-- in Unix seconds: the key then expires a second after e, e * 1000 + 1000
-- - m milliseconds from now; or, for a key in envoyproxy/ratelimit's
-- layout (store.PlainKeys: the window is in the key's name, the value is
-- the bare count), "cost:limit:p:ttl", ttl the milliseconds of the
-- reference's expiry, set at every write as its EXPIRE after each INCRBY.
-- Hits alike send the same field, which the script reads once a call
-- (each argument and each conversion costs Redis more than a key lookup).
local vals = redis.call('MGET', unpack(KEYS))
local written = {} -- key -> the state an earlier request of this call wrote
local fields = {} -- field -> {cost, limit, e, plain ttl or nil, cost as sent, e as a number}
local out, counts, hit = {}, {}, {}
local k, a, na = 0, 1, #ARGV
while a <= na do
  local n, m = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  local base = #out
  local status = 1
  for i = 1, n do
    local f = ARGV[a + i - 1]
    local h = fields[f]
    if h == nil then
      local c, l, e, ttl = string.match(f, '^(%d+):(%d+):(%w+):?(%d*)$')
      h = {tonumber(c), tonumber(l), e, e == 'p' and ttl or nil, c, tonumber(e)}
      fields[f] = h
    end
    hit[i] = h
    local cost, limit, e = h[1], h[2], h[3]
    local v = written[KEYS[k + i]]
    if v == nil then v = vals[k + i] end
    local count = 0
    if v and h[4] then
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
        if not (ven and ven < h[6] and string.find(v, '^%d+$', p + 1)) then status = -1 break end
      end
    end
    out[base + 1 + i], counts[i] = count, count + cost
    -- (A check, cost 0, fits unless the count is past the limit.)
    if not (count <= limit and cost <= limit - count) then status = 0 end
  end
  out[base + 1] = status
  if status == 1 then
    for i = 1, n do
      local h = hit[i]
      if h[1] > 0 then
        local s
        if h[4] then
          s = counts[i]
          redis.call('SET', KEYS[k + i], s, 'PX', h[4])
        elseif out[base + 1 + i] > 0 then
          -- (counts below 10^14 concatenate as plain integers)
          s = h[3] .. ':' .. counts[i]
          -- A count of this window was written with its expiry (cheaper).
          redis.call('SET', KEYS[k + i], s, 'KEEPTTL')
        else
          -- The window's first count is the cost, as the caller wrote it:
          -- no number to format (which costs Redis as much as a SET).
          s = h[3] .. ':' .. h[5]
          redis.call('SET', KEYS[k + i], s, 'PX', h[6] * 1000 + 1000 - m)
        end
        written[KEYS[k + i]] = s
      end
    end
  elseif status == -1 then
    for i = 1, n do out[base + 1 + i] = 0 end
  end
  k, a = k + n, a + n
end
return out
