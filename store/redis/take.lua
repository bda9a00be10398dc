-- take.lua applies one batch of hits atomically. Go precomputes everything
-- that depends only on the clock and the rule; the script adds and compares
-- the stored state. Lua numbers are doubles, exact only below 2^53, while
-- token-bucket states are ~2^61 quanta, so those are handled as decimal
-- strings split into base-10^7 limbs (least significant first), where every
-- limb product and carry stays exact. Window counts stay at or below 2^53.
--
-- ARGV[1]  "1": token buckets read the clock from Redis TIME ("server"
--          clock); "0": every time is given by the caller; "r": refunds
--          (see below).
-- ARGV[2+8(i-1) ...] are the 8 fields of hit i, on KEYS[i]:
--   "f", flags, cost, limit, e, ttl, bound, layout
--   "s", flags, cost, limit, j, "g:bits", ttl, bms
--   "t", flags, ck, a, b, c, d, m
-- flags is a number, the sum of 1 for veto, 2 for a cost beyond the
-- capacity (it never fits), 4 × the mode (0 take, 1 saturate, 2 charge,
-- 3 refund) and 16 for a check (a hit of cost 0, a peek: it consumes
-- nothing, and its cost field holds what it needs to find, 0 or, under
-- store.PeekStrict, 1: store.Hit.Need). For a fixed window, cost is
-- at most bound, the most a count holds (2^32-2 or 2^53), e is the end
-- (Unix seconds) of the window holding now and ttl the milliseconds until
-- a second after it; layout is "" for Sluice's state ("end:count") or "p"
-- for a key in envoyproxy/ratelimit's layout (store.PlainKeys): the
-- window is in the key's name, the value is the bare count (held here
-- as a state of window e, at most bound), and ttl is the milliseconds of
-- the reference's expiry, set at every write as its EXPIRE after each
-- INCRBY. For a sliding window, cost is at most 2^33, j is the
-- index of the bucket holding now modulo 2^32, g the buckets per window,
-- bits the width of each bucket's count, ttl the milliseconds until a
-- second after now's bucket leaves the window and bms a bucket's length in
-- milliseconds. For a token bucket, ck is the cost in quanta (at most the
-- burst for a take or a saturating hit, one token for a check, else up to
-- the capacity and the debt bound and one quantum), m milliseconds per
-- quantum (for the key's expiry), and a, b, c, d are floor(now),
-- ceil(now), floor(now)+capacity and ceil(now)+capacity in quanta, or with
-- the server clock quanta per period, the period in nanoseconds, the
-- capacity in quanta and "".
-- Returns {committed, TIME seconds, TIME microseconds, state of each key
-- before the batch..., state of each key after it...}.
-- One fixed-window take or saturating hit (a lone vetoing take goes to
-- window.lua instead, except on Cluster): the steps of the batch below
-- (take, or saturate, on the window holding now or the later one the state
-- holds), without its machinery.
if #KEYS == 1 and ARGV[2] == 'f' and ARGV[1] ~= 'r' and tonumber(ARGV[3]) % 16 < 8 then
  local key, f = KEYS[1], tonumber(ARGV[3])
  local cost, limit, we, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
  local plain = ARGV[9] == 'p'
  local v, oe, oc = redis.call('GET', key), 0, 0
  if v and plain then
    oe, oc = we, math.min(tonumber(v), tonumber(ARGV[8]))
  elseif v then
    local a, b = string.match(v, '^(%d+):(%d+)$')
    oe, oc = tonumber(a), tonumber(b)
  end
  local e, c = oe, oc
  local cur, count = math.max(we, oe), 0
  if oe == cur then count = oc end
  local check = f >= 16
  local ok = f % 4 < 2 and count <= limit and cost <= limit - count
  if ok then
    if not check then e, c = cur, count + cost end
  elseif f % 16 >= 4 and count < limit and not check then
    e, c = cur, count + math.min(cost, limit - count)
  end
  if e ~= oe or c ~= oc then
    if plain then
      redis.call('SET', key, string.format('%d', c), 'PX', ttl)
    else
      if e > we then ttl = tonumber(ttl) + (e - we) * 1000 end
      redis.call('SET', key, string.format('%d:%d', e, c), 'PX', ttl)
    end
  end
  local committed = 1
  if f % 2 == 1 and not ok then committed = 0 end
  return {committed, '', '', string.format('%d:%d', oe, oc), string.format('%d:%d', e, c)}
end

-- One token-bucket take or saturating hit with the caller's clock: the
-- same steps on two base-10^9 limbs held in locals (values stay below
-- 1.7e19, so the high limb below 1.7e10).
if #KEYS == 1 and ARGV[2] == 't' and ARGV[1] == '0' and tonumber(ARGV[3]) % 16 < 8 then
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
  local zero = f >= 16
  if f % 4 < 2 then
    if full then
      ok = true
      if not zero then nh, nl = plus(ch, cl, split(ARGV[6])) end
    else
      local th, tl = plus(sh, sl, ch, cl)
      if le(th, tl, split(ARGV[7])) then
        ok = true
        if not zero then nh, nl = th, tl end
      end
    end
  end
  if not ok and f % 16 >= 4 and not zero then
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
-- cost*k) and, for a fixed window, the end of the window of the take and
-- the bound at which its count is saturated ("" if never), joined by ":"
-- ("" for a token bucket; for a sliding window "s" then the bucket of the
-- take, the width of a count and the buckets per window, joined by ":";
-- for a key in the reference's layout "p" and the bound).
-- They are store.Rollback, except that a sliding window in debt is left as
-- it is (denying more, never granting more); the expiry stays.
if ARGV[1] == 'r' then
  for i = 1, #KEYS do
    local v, a, e = redis.call('GET', KEYS[i]), ARGV[2 * i], ARGV[2 * i + 1]
    local sb, sbits, sg = string.match(e, '^s(%d+):(%d+):(%d+)$')
    local si, sc
    if v then si, sc = string.match(v, '^(%d+):(%d+)$') end
    if sc and sb then
      si, sc, sb, sbits, sg = tonumber(si), tonumber(sc), tonumber(sb), tonumber(sbits), tonumber(sg)
      local d = (si - sb) % 4294967296
      if sc > 0 and d <= sg then
        local p = 2 ^ (d * sbits)
        local c = sc - math.min(tonumber(a), math.floor(sc / p) % 2 ^ sbits) * p
        redis.call('SET', KEYS[i], string.format('%d:%d', si, c), 'KEEPTTL')
      end
    elseif sc and e ~= '' then
      local te, bound = string.match(e, '^(%d+):(%d*)$')
      local c = tonumber(sc)
      if si == te and (bound == '' or c < tonumber(bound)) then
        c = math.max(c - tonumber(a), 0)
        redis.call('SET', KEYS[i], string.format('%d:%d', tonumber(si), c), 'KEEPTTL')
      end
    elseif v and string.sub(e, 1, 1) == 'p' then
      -- a key in the reference's layout: "p" then the bound ("" if none)
      local c, bound = tonumber(v), string.sub(e, 2)
      if c and (bound == '' or c < tonumber(bound)) then
        redis.call('SET', KEYS[i], string.format('%d', math.max(c - tonumber(a), 0)), 'KEEPTTL')
      end
    elseif v and e == '' then
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

-- MAXDEBT is store.MaxDebt: the most quanta a charge leaves a token bucket
-- owing past its capacity.
local MAXDEBT = num('2305843009213693952')
local M32 = 4294967296

-- Per hit: the parsed parameters, computed once.
local hits = {}
for i = 1, #KEYS do
  local o = 2 + 8 * (i - 1)
  local f = tonumber(ARGV[o + 1])
  local h = {key = KEYS[i], alg = ARGV[o], veto = f % 2 == 1, beyond = f % 4 >= 2,
    mode = math.floor(f % 16 / 4), zero = f >= 16}
  if h.alg == 'f' then
    h.cost, h.limit = tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])
    h.e, h.ttl, h.bound = tonumber(ARGV[o + 4]), ARGV[o + 5], tonumber(ARGV[o + 6])
    h.plain = ARGV[o + 7] == 'p'
  elseif h.alg == 's' then
    local g, bits = string.match(ARGV[o + 5], '^(%d+):(%d+)$')
    h.cost, h.limit, h.j = tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4])
    h.g, h.bits, h.ttl, h.bms = tonumber(g), tonumber(bits), ARGV[o + 6], tonumber(ARGV[o + 7])
  else
    h.ck, h.ms = num(ARGV[o + 2]), tonumber(ARGV[o + 7])
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
-- held in the same fields, or in debt the index of the bucket holding the
-- limit and the debt, "index:ddebt"; for a token bucket the theoretical
-- arrival time (TAT) in quanta. orig holds them as read, before the batch.
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
    if h.plain then
      local e, c = 0, 0
      if v then e, c = h.e, math.min(tonumber(v), h.bound) end
      orig[h.key] = {e = e, c = c, debt = 0}
    elseif h.alg ~= 't' then
      local e, c, debt = 0, 0, 0
      if v then
        local a, d, b = string.match(v, '^(%d+):(d?)(%d+)$')
        e = tonumber(a)
        if d == 'd' then debt = tonumber(b) else c = tonumber(b) end
      end
      orig[h.key] = {e = e, c = c, debt = debt}
    else
      orig[h.key] = num(v or '0')
    end
  end
end

-- The functions below are the store package's TakeWindow, TakeTokens,
-- TakeSliding, Saturate, Charge, Refund and Rollback on these states.

-- window returns the window a fixed-window hit counts in (the one holding
-- now, or the later one s holds if the clock stepped back) and its count.
local function window(h, s)
  local e = math.max(h.e, s.e)
  if s.e == e then return e, s.c end
  return e, 0
end

-- exact reports whether a fixed-window count is not saturated at its
-- bound past the limit.
local function exact(h, c)
  return c < h.bound or h.bound <= h.limit
end

-- slide returns the newest bucket a sliding-window hit counts in (the one
-- holding now, or the later one s holds if the clock stepped back) and the
-- counts of s, a state without debt, shifted to it. Every value stays
-- below 2^32: exact.
local function slide(h, s)
  if s.e == 0 and s.c == 0 then return h.j, 0 end
  local d = (h.j - s.e) % M32
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

-- debtIndex is the bucket index of a debt state, near now's bucket
-- (within 2^31 buckets either way; outside the modulo).
local function debtIndex(h, s)
  local d = (h.j - s.e) % M32
  if d >= 2147483648 then d = d - M32 end
  return h.j - d
end

-- debtBound is store's slidingDebtBound.
local function debtBound(h)
  return math.min(4294967294, h.limit * (math.floor(1073741823 / (h.g + 1)) - 1))
end

-- settle returns a sliding-window state as of now's bucket: a debt the
-- window's slides have repaid becomes the counts it left (its last part
-- in the bucket it entered); otherwise what is left of it, from the
-- latest bucket it entered.
local function settle(h, s)
  if s.debt == 0 then return s end
  local b = debtIndex(h, s)
  if h.j < b + h.g + 1 then return s end
  local k = math.floor((h.j - b) / (h.g + 1))
  if s.debt > k * h.limit then
    return {e = (b + k * (h.g + 1)) % M32, c = 0, debt = s.debt - k * h.limit}
  end
  k = math.floor((s.debt + h.limit - 1) / h.limit)
  return {e = (b + k * (h.g + 1)) % M32, c = s.debt - (k - 1) * h.limit, debt = 0}
end

-- take returns the state after hit h on s and whether h is allowed.
local function take(h, s)
  if h.alg == 's' then
    local st = settle(h, s)
    if st.debt > 0 then return s, false end
    local n, c = slide(h, st)
    local u = used(h, c)
    if not h.beyond and u <= h.limit and h.cost <= h.limit - u then
      if h.zero then return s, true end
      return {e = n, c = c + h.cost, debt = 0}, true
    end
    return s, false
  end
  if h.alg == 'f' then
    local e, c = window(h, s)
    if not h.beyond and c <= h.limit and h.cost <= h.limit - c then
      if h.zero then return s, true end
      return {e = e, c = c + h.cost, debt = 0}, true
    end
    return s, false
  end
  if h.beyond then return s, false end
  if cmp(s, h.nf) <= 0 then
    if h.zero then return s, true end
    return add(h.nc, h.ck), true
  end
  local n = add(s, h.ck)
  if cmp(n, h.lim) <= 0 then
    if h.zero then return s, true end
    return n, true
  end
  return s, false
end

-- saturate is take, except that a hit that does not fit consumes what is
-- left, up to its cost.
local function saturate(h, s)
  local n, ok = take(h, s)
  if ok or h.zero or h.cost == 0 then return n, ok end
  if h.alg == 's' then
    local st = settle(h, s)
    if st.debt > 0 then return s, false end
    local e, c = slide(h, st)
    local u = used(h, c)
    if u >= h.limit then return s, false end
    return {e = e, c = c + math.min(h.cost, h.limit - u), debt = 0}, false
  end
  if h.alg == 'f' then
    local e, c = window(h, s)
    if c >= h.limit then return s, false end
    return {e = e, c = c + math.min(h.cost, h.limit - c), debt = 0}, false
  end
  local base = s
  if cmp(s, h.nf) <= 0 then base = h.nc end
  if cmp(base, h.cap) >= 0 then return s, false end
  n = add(base, h.ck)
  if cmp(n, h.cap) > 0 then n = h.cap end
  return n, false
end

-- charge is take, except that a hit that does not fit is recorded whole:
-- past a fixed window's limit up to its bound, as a token bucket's or a
-- sliding window's debt up to theirs; a sliding window of a limit of 0
-- marks now's bucket used (its count is one bit).
local function charge(h, s)
  local n, ok = take(h, s)
  if ok or h.zero or h.cost == 0 then return n, ok end
  if h.alg == 's' then
    if h.limit == 0 then
      local e, c = slide(h, s)
      if c % 2 == 0 then c = c + 1 end
      return {e = e, c = c, debt = 0}, false
    end
    local st, db = settle(h, s), debtBound(h)
    if st.debt > 0 then
      return {e = st.e, c = 0, debt = st.debt + math.min(h.cost, db - st.debt)}, false
    end
    local e, c = slide(h, st)
    local left = h.limit - used(h, c)
    return {e = e, c = 0, debt = math.min(h.cost - left, db)}, false
  end
  if h.alg == 'f' then
    local e, c = window(h, s)
    if c >= h.bound then return s, false end
    return {e = e, c = c + math.min(h.cost, h.bound - c), debt = 0}, false
  end
  local base = s
  if cmp(s, h.nf) <= 0 then base = h.nc end
  local bound = add(h.cap, MAXDEBT)
  if cmp(base, bound) >= 0 then return s, false end
  n = add(base, h.ck)
  if cmp(n, bound) > 0 then n = bound end
  return n, false
end

-- refund gives a hit's cost back: never below empty, never above the
-- capacity; a saturated fixed-window count stays.
local function refund(h, s)
  if h.zero or h.cost == 0 then return s end
  if h.alg == 's' then
    local st = settle(h, s)
    if st.debt > 0 then
      if h.cost < st.debt then return {e = st.e, c = 0, debt = st.debt - h.cost} end
      return {e = st.e, c = h.limit - math.min(h.limit, h.cost - st.debt), debt = 0}
    end
    local n, c = slide(h, st)
    if c == 0 then return s end
    local cost, m = h.cost, 2 ^ h.bits
    for i = h.g, 0, -1 do
      local p = 2 ^ (i * h.bits)
      local x = math.min(math.floor(c / p) % m, cost)
      c, cost = c - x * p, cost - x
    end
    return {e = n, c = c, debt = 0}
  end
  if h.alg == 'f' then
    local e, c = window(h, s)
    if c == 0 or not exact(h, c) then return s end
    return {e = e, c = c - math.min(h.cost, c), debt = 0}
  end
  if cmp(s, h.nf) <= 0 then return s end
  if cmp(h.ck, sub(s, h.nf)) < 0 then return sub(s, h.ck) end
  return ZERO
end

-- rollback undoes an allowed take of h that left the state after.
local function rollback(h, s, after)
  if h.alg == 's' then
    if s.debt > 0 then return refund(h, s) end
    local d = (s.e - after.e) % M32
    if s.c == 0 or d > h.g then return s end
    local p = 2 ^ (d * h.bits)
    return {e = s.e, c = s.c - math.min(h.cost, math.floor(s.c / p) % 2 ^ h.bits) * p, debt = 0}
  end
  if h.alg == 'f' then
    if s.e ~= after.e or not exact(h, s.c) then return s end
    return {e = s.e, c = s.c - math.min(h.cost, s.c), debt = 0}
  end
  if cmp(h.ck, s) >= 0 then return ZERO end
  return sub(s, h.ck)
end

local function same(h, a, b)
  if h.alg ~= 't' then return a.e == b.e and a.c == b.c and a.debt == b.debt end
  return cmp(a, b) == 0
end

-- The batch runs as the memory store runs it (store/memory Take):
-- vetoing hits in order, then the others; once a vetoing hit is denied,
-- later takes only look while other modes still apply; a denied batch
-- then rolls its takes back in reverse order.
local st, taken, denied = {}, {}, false
for k, v in pairs(orig) do st[k] = v end
local function apply(h)
  local b, a, ok = st[h.key], nil, true
  if h.mode == 1 then
    a, ok = saturate(h, b)
  elseif h.mode == 2 then
    a, ok = charge(h, b)
  elseif h.mode == 3 then
    a = refund(h, b)
  else
    a, ok = take(h, b)
  end
  st[h.key] = a
  return b, a, ok
end
for i = 1, #hits do
  local h = hits[i]
  if h.veto and (h.mode > 0 or not denied) then
    local b, a, ok = apply(h)
    if not ok then
      denied = true
    elseif h.mode == 0 and not same(h, a, b) then
      taken[i] = {b, a}
    end
  end
end
for i = 1, #hits do
  local h = hits[i]
  if not h.veto and (h.mode > 0 or not denied) then apply(h) end
end
if denied then
  for i = #hits, 1, -1 do
    local t, h = taken[i], hits[i]
    if t then
      if same(h, st[h.key], t[2]) then st[h.key] = t[1] else st[h.key] = rollback(h, st[h.key], t[2]) end
    end
  end
end
local committed = not denied

-- fmt is the stored form of a window state.
local function fmt(s)
  if s.debt > 0 then return string.format('%d:d%d', s.e, s.debt) end
  return string.format('%d:%d', s.e, s.c)
end

-- Write the keys whose state changed, expiring when the state is fresh
-- again, plus a second of slack since Redis counts by its own clock: a
-- fixed window at its end, a sliding window when now's bucket leaves it
-- (a later bucket the key holds keeps its expiry) or, in debt, when the
-- debt's last part leaves it, a token bucket when full.
local out, done = {committed and 1 or 0, tsec, tusec}, {}
local n = #hits
for i = 1, n do
  local h = hits[i]
  local v, o = st[h.key], orig[h.key]
  if h.alg ~= 't' then
    if not done[h.key] and not same(h, v, o) then
      if h.alg == 's' and v.debt > 0 then
        local k = math.floor((v.debt + h.limit - 1) / h.limit)
        local last = debtIndex(h, v) + (k + 1) * (h.g + 1)
        local ttl = tonumber(h.ttl) + math.max(last - h.j - h.g - 1, 0) * h.bms
        redis.call('SET', h.key, fmt(v), 'PX', string.format('%.0f', math.min(math.ceil(ttl), 1e15)))
      elseif h.alg == 's' and v.e ~= h.j then
        redis.call('SET', h.key, fmt(v), 'KEEPTTL')
      elseif h.plain then
        redis.call('SET', h.key, string.format('%d', v.c), 'PX', h.ttl)
      else
        local ttl = h.ttl
        if h.alg == 'f' and v.e > h.e then ttl = tonumber(ttl) + (v.e - h.e) * 1000 end
        redis.call('SET', h.key, fmt(v), 'PX', ttl)
      end
    end
    out[3 + i] = fmt(o)
    out[3 + n + i] = fmt(v)
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
