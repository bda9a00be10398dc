-- take.lua applies one batch of hits atomically. Go precomputes everything
-- that depends only on the clock and the rule; the script adds and compares
-- the stored state. Lua numbers are doubles, exact only below 2^53, while
-- token-bucket states are ~2^61 quanta, so those are handled as decimal
-- strings split into base-10^7 limbs (least significant first), where every
-- limb product and carry stays exact.
--
-- ARGV[1]  "1": token buckets read the clock from Redis TIME ("server"
--          clock); "0": every time is given by the caller; "r": refunds
--          (see below).
-- ARGV[2+8(i-1) ...] are the 8 fields of hit i, on KEYS[i]:
--   "f", flags, cost (at most limit+1), limit, e, ttl, "", ""
--   "s", flags, cost (at most limit+1), limit, j, g, bits, ttl
--   "t", flags, ck, a, b, c, d, m
-- flags is a digit, the sum of 1 for veto, 2 for saturate and 4 for a
-- token-bucket cost beyond the burst (never allowed). For a fixed window,
-- e is the end (Unix seconds) of the window holding now and ttl the
-- milliseconds until a second after it. For a sliding window, j is the
-- index of the bucket holding now modulo 2^32, g the buckets per window,
-- bits the width of each bucket's count and ttl the milliseconds until a
-- second after now's bucket leaves the window. For a token bucket, ck is the cost
-- (at most the burst) in quanta, m milliseconds per quantum (for the key's
-- expiry), and a, b, c, d are floor(now), ceil(now), floor(now)+capacity
-- and ceil(now)+capacity in quanta, or with the server clock quanta per
-- period, the period in nanoseconds, the capacity in quanta and "".
-- Returns {committed, TIME seconds, TIME microseconds, state of each key
-- before the batch..., state of each key after it...}.
-- One fixed-window hit (a lone vetoing one goes to window.lua instead,
-- except on Cluster): the steps of the batch below (take, or saturate, on
-- the window holding now or the later one the state holds), without its
-- machinery.
if #KEYS == 1 and ARGV[2] == 'f' and ARGV[1] ~= 'r' then
  local key, f = KEYS[1], tonumber(ARGV[3])
  local cost, limit, we, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
  local v, oe, oc = redis.call('GET', key), 0, 0
  if v then
    local a, b = string.match(v, '^(%d+):(%d+)$')
    oe, oc = tonumber(a), tonumber(b)
  end
  local e, c = oe, oc
  local cur, count = math.max(we, oe), 0
  if oe == cur then count = oc end
  local ok = limit > 0 and count <= limit and cost <= limit - count
  if ok then
    if cost > 0 then e, c = cur, count + cost end
  elseif f % 4 >= 2 and count < limit and cost > 0 then
    e, c = cur, count + math.min(cost, limit - count)
  end
  if e ~= oe or c ~= oc then
    if e > we then ttl = tonumber(ttl) + (e - we) * 1000 end
    redis.call('SET', key, e .. ':' .. c, 'PX', ttl)
  end
  local committed = 1
  if f % 2 == 1 and not ok then committed = 0 end
  return {committed, '', '', oe .. ':' .. oc, e .. ':' .. c}
end

-- One token-bucket hit with the caller's clock: the same steps on two
-- base-10^9 limbs held in locals (values stay below 1.4e19, so the high
-- limb below 1.4e10).
if #KEYS == 1 and ARGV[2] == 't' and ARGV[1] == '0' then
  local function split(x)
    local n = #x
    if n <= 9 then return 0, tonumber(x) end
    return tonumber(string.sub(x, 1, n - 9)), tonumber(string.sub(x, n - 8))
  end
  local function le(ah, al, bh, bl) return ah < bh or (ah == bh and al <= bl) end
  local function plus(ah, al, bh, bl)
    local h, l = ah + bh, al + bl
    if l >= 1e9 then return h + 1, l - 1e9 end
    return h, l
  end
  local function fmt(h, l)
    if h == 0 then return string.format('%d', l) end
    return string.format('%d%09d', h, l)
  end
  local key, f = KEYS[1], tonumber(ARGV[3])
  local v = redis.call('GET', key) or '0'
  local sh, sl = split(v)
  local ch, cl = split(ARGV[4])
  local fh, fl = split(ARGV[5])
  local full = le(sh, sl, fh, fl)
  local nh, nl, ok = sh, sl, false
  if f < 4 then
    if full then
      ok = true
      if ARGV[4] ~= '0' then nh, nl = plus(ch, cl, split(ARGV[6])) end
    else
      local th, tl = plus(sh, sl, ch, cl)
      if le(th, tl, split(ARGV[7])) then nh, nl, ok = th, tl, true end
    end
  end
  if not ok and f % 4 >= 2 then
    local bh, bl = sh, sl
    if full then bh, bl = split(ARGV[6]) end
    local th, tl = plus(bh, bl, ch, cl)
    local caph, capl = split(ARGV[8])
    if not le(th, tl, caph, capl) then th, tl = caph, capl end
    if le(th, tl, sh, sl) then th, tl = sh, sl end
    nh, nl = th, tl
  end
  local ns = v
  if nh ~= sh or nl ~= sl then
    ns = fmt(nh, nl)
    local q = 0
    if not le(nh, nl, fh, fl) then q = (nh - fh) * 1e9 + (nl - fl) end
    -- capped at ~31,700 years, within what PX accepts
    local ttl = math.min(math.floor(q * tonumber(ARGV[9])) + 1000, 1e15)
    redis.call('SET', key, ns, 'PX', string.format('%.0f', ttl))
  end
  local committed = 1
  if f % 2 == 1 and not ok then committed = 0 end
  return {committed, '', '', v, ns}
end

local B = 10000000

local function num(s)
  local a, n = {}, #s
  while n > 0 do
    local m = n - 7
    if m < 0 then m = 0 end
    a[#a + 1] = tonumber(string.sub(s, m + 1, n))
    n = m
  end
  if #a == 0 then a[1] = 0 end
  return a
end

local function str(a)
  local n = #a
  while n > 1 and a[n] == 0 do n = n - 1 end
  local t = {string.format('%d', a[n])}
  for i = n - 1, 1, -1 do t[#t + 1] = string.format('%07d', a[i]) end
  return table.concat(t)
end

local function cmp(a, b)
  for i = math.max(#a, #b), 1, -1 do
    local x, y = a[i] or 0, b[i] or 0
    if x ~= y then
      if x < y then return -1 end
      return 1
    end
  end
  return 0
end

local function add(a, b)
  local r, c = {}, 0
  for i = 1, math.max(#a, #b) do
    local s = (a[i] or 0) + (b[i] or 0) + c
    if s >= B then r[i] = s - B; c = 1 else r[i] = s; c = 0 end
  end
  if c > 0 then r[#r + 1] = c end
  return r
end

-- sub returns a-b for a >= b.
local function sub(a, b)
  local r, c = {}, 0
  for i = 1, math.max(#a, #b) do
    local s = (a[i] or 0) - (b[i] or 0) - c
    if s < 0 then r[i] = s + B; c = 1 else r[i] = s; c = 0 end
  end
  return r
end

local function mul(a, b)
  local r = {}
  for i = 1, #a + #b do r[i] = 0 end
  for i = 1, #a do
    local c = 0
    for j = 1, #b do
      local s = r[i + j - 1] + a[i] * b[j] + c
      c = math.floor(s / B)
      r[i + j - 1] = s - c * B
    end
    r[i + #b] = r[i + #b] + c
  end
  return r
end

-- div returns floor(a/b) and whether the remainder is non-zero, by
-- subtracting doublings of b (the quotients here stay below 2^64).
local function div(a, b)
  local ds, ps = {b}, {{1}}
  while cmp(ds[#ds], a) <= 0 do
    ds[#ds + 1] = add(ds[#ds], ds[#ds])
    ps[#ps + 1] = add(ps[#ps], ps[#ps])
  end
  local q = {0}
  for i = #ds, 1, -1 do
    if cmp(ds[i], a) <= 0 then
      a = sub(a, ds[i])
      q = add(q, ps[i])
    end
  end
  return q, cmp(a, {0}) > 0
end

local ZERO, ONE = {0}, {1}

-- Refunds (Cluster, when another slot denied the batch): ARGV[1] is "r",
-- then two fields per key: the amount to take back (requests, or quanta:
-- cost*k) and, for a fixed window, the end of the window of the take (""
-- for a token bucket; for a sliding window "s" then the bucket of the
-- take, the width of a count and the buckets per window, joined by ":").
-- They are store.Refund; the expiry stays.
if ARGV[1] == 'r' then
  for i = 1, #KEYS do
    local v, a, e = redis.call('GET', KEYS[i]), ARGV[2 * i], ARGV[2 * i + 1]
    local sb, sbits, sg = string.match(e, '^s(%d+):(%d+):(%d+)$')
    if v and sb then
      local si, sc = string.match(v, '^(%d+):(%d+)$')
      si, sc, sb, sbits, sg = tonumber(si), tonumber(sc), tonumber(sb), tonumber(sbits), tonumber(sg)
      local d = (si - sb) % 4294967296
      if sc > 0 and d <= sg then
        local p = 2 ^ (d * sbits)
        local c = sc - math.min(tonumber(a), math.floor(sc / p) % 2 ^ sbits) * p
        redis.call('SET', KEYS[i], si .. ':' .. string.format('%d', c), 'KEEPTTL')
      end
    elseif v and e ~= '' then
      local we, c = string.match(v, '^(%d+):(%d+)$')
      if we == e then
        c = math.max(tonumber(c) - tonumber(a), 0)
        redis.call('SET', KEYS[i], we .. ':' .. string.format('%d', c), 'KEEPTTL')
      end
    elseif v then
      local q, t = num(a), num(v)
      if cmp(q, t) >= 0 then
        redis.call('DEL', KEYS[i])
      else
        redis.call('SET', KEYS[i], str(sub(t, q)), 'KEEPTTL')
      end
    end
  end
  return 1
end

local server = ARGV[1] == '1'
local tsec, tusec, now = '', '', nil
if server then
  local t = redis.call('TIME')
  tsec, tusec = t[1], t[2]
  now = num(tsec .. string.format('%06d', tonumber(tusec)) .. '000')
end

-- Per hit: the parsed parameters, computed once.
local hits = {}
for i = 1, #KEYS do
  local o = 2 + 8 * (i - 1)
  local f = tonumber(ARGV[o + 1])
  local h
  if ARGV[o] == 'f' then
    h = {key = KEYS[i], alg = 'f', veto = f % 2 == 1, sat = f % 4 >= 2,
      cost = tonumber(ARGV[o + 2]), limit = tonumber(ARGV[o + 3]),
      e = tonumber(ARGV[o + 4]), ttl = ARGV[o + 5]}
  elseif ARGV[o] == 's' then
    h = {key = KEYS[i], alg = 's', veto = f % 2 == 1, sat = f % 4 >= 2,
      cost = tonumber(ARGV[o + 2]), limit = tonumber(ARGV[o + 3]),
      j = tonumber(ARGV[o + 4]), g = tonumber(ARGV[o + 5]), bits = tonumber(ARGV[o + 6]),
      ttl = ARGV[o + 7]}
  else
    h = {key = KEYS[i], alg = 't', veto = f % 2 == 1, sat = f % 4 >= 2,
      never = f >= 4, zero = ARGV[o + 2] == '0', ck = num(ARGV[o + 2]),
      ms = tonumber(ARGV[o + 7]), nf = false, nc = false, lim = false, cap = false}
    if server then
      local rk, period, tol = num(ARGV[o + 3]), num(ARGV[o + 4]), num(ARGV[o + 5])
      local q, frac = div(mul(now, rk), period)
      h.nf = q
      if frac then h.nc = add(q, ONE) else h.nc = q end
      h.lim, h.cap = add(h.nf, tol), add(h.nc, tol)
    else
      h.nf, h.nc = num(ARGV[o + 3]), num(ARGV[o + 4])
      h.lim, h.cap = num(ARGV[o + 5]), num(ARGV[o + 6])
    end
  end
  hits[i] = h
end

-- The state of each key: for a fixed window the end of the window it
-- counts (Unix seconds) and its count, stored as "end:count"; for a
-- sliding window the index of its newest bucket (modulo 2^32) and the
-- bucket counts packed as the store package packs them, "index:counts",
-- held in the same fields; for a token bucket the theoretical arrival
-- time (TAT) in quanta. orig holds them as read, before the batch.
local orig, distinct = {}, {}
for i = 1, #hits do
  local k = hits[i].key
  if orig[k] == nil then
    orig[k] = false
    distinct[#distinct + 1] = k
  end
end
local vals = redis.call('MGET', unpack(distinct))
for i = 1, #hits do
  local h = hits[i]
  if orig[h.key] == false then
    local v = false
    for j = 1, #distinct do
      if distinct[j] == h.key then v = vals[j] break end
    end
    if h.alg ~= 't' then
      local e, c = 0, 0
      if v then
        local a, b = string.match(v, '^(%d+):(%d+)$')
        e, c = tonumber(a), tonumber(b)
      end
      orig[h.key] = {e = e, c = c}
    else
      orig[h.key] = num(v or '0')
    end
  end
end

-- The functions below are store.TakeWindow, store.TakeTokens, Saturate
-- and Refund of the Go package, on these states.

-- window returns the window a fixed-window hit counts in (the one holding
-- now, or the later one s holds if the clock stepped back) and its count.
local function window(h, s)
  local e = math.max(h.e, s.e)
  if s.e == e then return e, s.c end
  return e, 0
end

-- slide returns the newest bucket a sliding-window hit counts in (the one
-- holding now, or the later one s holds if the clock stepped back) and the
-- counts of s shifted to it. Every value stays below 2^32: exact.
local function slide(h, s)
  if s.e == 0 and s.c == 0 then return h.j, 0 end
  local d = (h.j - s.e) % 4294967296
  if d >= 2147483648 then return s.e, s.c end
  if d > h.g then return h.j, 0 end
  return h.j, (s.c % 2 ^ ((h.g + 1 - d) * h.bits)) * 2 ^ (d * h.bits)
end

-- used is the sum of the bucket counts c.
local function used(h, c)
  local sum, m = 0, 2 ^ h.bits
  for _ = 0, h.g do
    sum = sum + c % m
    c = math.floor(c / m)
  end
  return sum
end

-- take returns the state after hit h on s and whether h is allowed.
local function take(h, s)
  if h.alg == 's' then
    local n, c = slide(h, s)
    local u = used(h, c)
    if h.limit > 0 and u <= h.limit and h.cost <= h.limit - u then
      if h.cost == 0 then return s, true end
      return {e = n, c = c + h.cost}, true
    end
    return s, false
  end
  if h.alg == 'f' then
    local e, c = window(h, s)
    if h.limit > 0 and c <= h.limit and h.cost <= h.limit - c then
      if h.cost == 0 then return s, true end
      return {e = e, c = c + h.cost}, true
    end
    return s, false
  end
  if h.never then return s, false end
  if cmp(s, h.nf) <= 0 then
    if h.zero then return s, true end
    return add(h.nc, h.ck), true
  end
  local n = add(s, h.ck)
  if cmp(n, h.lim) <= 0 then return n, true end
  return s, false
end

-- saturate is take, except that a hit that does not fit consumes what is
-- left, up to its cost.
local function saturate(h, s)
  local n, ok = take(h, s)
  if ok then return n, ok end
  if h.alg == 's' then
    local e, c = slide(h, s)
    local u = used(h, c)
    if u >= h.limit or h.cost == 0 then return s, false end
    return {e = e, c = c + math.min(h.cost, h.limit - u)}, false
  end
  if h.alg == 'f' then
    local e, c = window(h, s)
    if c >= h.limit or h.cost == 0 then return s, false end
    return {e = e, c = c + math.min(h.cost, h.limit - c)}, false
  end
  local base = s
  if cmp(s, h.nf) <= 0 then base = h.nc end
  n = add(base, h.ck)
  if cmp(n, h.cap) > 0 then n = h.cap end
  if cmp(n, s) < 0 then n = s end
  return n, false
end

-- refund rolls back an allowed take of h that left the state after.
local function refund(h, s, after)
  if h.alg == 's' then
    local d = (s.e - after.e) % 4294967296
    if h.cost > h.limit or s.c == 0 or d > h.g then return s end
    local p = 2 ^ (d * h.bits)
    return {e = s.e, c = s.c - math.min(h.cost, math.floor(s.c / p) % 2 ^ h.bits) * p}
  end
  if h.alg == 'f' then
    if s.e ~= h.e then return s end
    if h.cost >= s.c then return {e = h.e, c = 0} end
    return {e = h.e, c = s.c - h.cost}
  end
  if cmp(h.ck, s) >= 0 then return ZERO end
  return sub(s, h.ck)
end

local function same(h, a, b)
  if h.alg ~= 't' then return a.e == b.e and a.c == b.c end
  return cmp(a, b) == 0
end

-- The batch runs as the memory store runs it (store/memory Take):
-- vetoing hits in order, then the others; once a vetoing hit is denied,
-- later hits only look, except saturating ones, which always consume; a
-- denied batch then refunds its takes in reverse order.
local st, taken, denied = {}, {}, false
for k, v in pairs(orig) do st[k] = v end
local function apply(h)
  local b, a, ok = st[h.key], nil, nil
  if h.sat then a, ok = saturate(h, b) else a, ok = take(h, b) end
  st[h.key] = a
  return b, a, ok
end
for i = 1, #hits do
  local h = hits[i]
  if h.veto and (h.sat or not denied) then
    local b, a, ok = apply(h)
    if not ok then
      denied = true
    elseif not h.sat and not same(h, a, b) then
      taken[i] = {b, a}
    end
  end
end
for i = 1, #hits do
  local h = hits[i]
  if not h.veto and (h.sat or not denied) then apply(h) end
end
if denied then
  for i = #hits, 1, -1 do
    local t, h = taken[i], hits[i]
    if t then
      if same(h, st[h.key], t[2]) then st[h.key] = t[1] else st[h.key] = refund(h, st[h.key], t[2]) end
    end
  end
end
local committed = not denied

-- Write the keys whose state changed, expiring when the state is fresh
-- again, plus a second of slack since Redis counts by its own clock: a
-- fixed window at its end, a sliding window when now's bucket leaves it
-- (a later bucket the key holds keeps its expiry), a token bucket when
-- full.
local out, done = {committed and 1 or 0, tsec, tusec}, {}
local n = #hits
for i = 1, n do
  local h = hits[i]
  local v, o = st[h.key], orig[h.key]
  if h.alg ~= 't' then
    if not done[h.key] and not same(h, v, o) then
      if h.alg == 's' and v.e ~= h.j then
        redis.call('SET', h.key, v.e .. ':' .. v.c, 'KEEPTTL')
      else
        local ttl = h.ttl
        if h.alg == 'f' and v.e > h.e then ttl = tonumber(ttl) + (v.e - h.e) * 1000 end
        redis.call('SET', h.key, v.e .. ':' .. v.c, 'PX', ttl)
      end
    end
    -- (numbers below 10^14 concatenate as plain integers)
    out[3 + i] = o.e .. ':' .. o.c
    out[3 + n + i] = v.e .. ':' .. v.c
  else
    local os_, vs = str(o), nil
    if cmp(v, o) == 0 then vs = os_ else vs = str(v) end
    if not done[h.key] and vs ~= os_ then
      local q = 0
      if cmp(v, h.nf) > 0 then
        local d = sub(v, h.nf)
        for j = #d, 1, -1 do q = q * B + d[j] end
      end
      -- capped at ~31,700 years, within what PX accepts
      local ttl = math.min(math.floor(q * h.ms) + 1000, 1e15)
      redis.call('SET', h.key, vs, 'PX', string.format('%.0f', ttl))
    end
    out[3 + i], out[3 + n + i] = os_, vs
  end
  done[h.key] = true
end
return out
