// Sluice status page. Plain JavaScript, no dependencies; every URL is
// relative so the page works behind a reverse proxy's path prefix. Text
// from the server is set with textContent only, never parsed as HTML.
'use strict';

const $ = (sel) => document.querySelector(sel);

// el builds an element: el('td', {class: 'num'}, 'text', child...).
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else e.setAttribute(k, v);
  }
  for (const k of kids) {
    if (k !== null && k !== undefined) e.append(k);
  }
  return e;
}

function setText(sel, text) {
  const e = typeof sel === 'string' ? $(sel) : sel;
  if (e.textContent !== text) e.textContent = text;
}

async function getJSON(url) {
  const r = await fetch(url, {cache: 'no-store'});
  if (!r.ok) throw new Error(url + ': HTTP ' + r.status);
  return r.json();
}

function fmtDuration(s) {
  s = Math.max(0, Math.floor(s));
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  if (d) return d + 'd ' + h + 'h';
  if (h) return h + 'h ' + m + 'm';
  if (m) return m + 'm ' + (s % 60) + 's';
  return s + 's';
}

// fmtUnits writes a count compactly: 950, 12.3 k, 1.2 M, 4.3 G.
function fmtUnits(x) {
  for (const [d, s] of [[1e12, ' T'], [1e9, ' G'], [1e6, ' M'], [1e3, ' k']]) {
    if (x >= d) return (x / d).toFixed(x >= 10 * d ? 0 : 1) + s;
  }
  return String(Math.round(x));
}

// usage says how much of its limit a rule used over the last minute, per
// its unit ("1.2 M per minute of 2 M"), and what was charged: budgets of
// tokens or money are charged after the fact.
function usage(rule, r, interval) {
  if (!rule || rule.unlimited || !r.window || !r.within_per_s || !r.within_per_s.length) return '';
  const w = r.window, secs = r.within_per_s.length * interval;
  const unit = unitSeconds[rule.unit] * (rule.unit_multiplier || 1);
  const per = (rule.unit_multiplier > 1 ? rule.unit_multiplier + ' ' + rule.unit + 's' : rule.unit);
  let s = fmtUnits((w.within + w.over) / secs * unit) + ' per ' + per + ' of ' + fmtUnits(rule.requests_per_unit);
  if (w.charged) s += ' · ' + fmtUnits(w.charged) + ' charged';
  if (w.charged_over) s += ', ' + fmtUnits(w.charged_over) + ' past the limit';
  if (w.refunded) s += ' · ' + fmtUnits(w.refunded) + ' refunded';
  return s;
}

function fmtRate(x) {
  if (!x) return '0';
  if (x >= 100) return Math.round(x).toLocaleString();
  if (x >= 10) return x.toFixed(1);
  return x.toFixed(2);
}

function badge(sel, text, kind) {
  const e = $(sel);
  setText(e, text);
  e.className = e.className.replace(/\b(ok|bad|warn)\b/g, '').trim() + ' ' + kind;
}

// ---- Overview ------------------------------------------------------------

let configHash = null;

async function refreshOverview() {
  const o = await getJSON('ui/api/overview');
  lookupStatus(o.counters || {});
  badge('#health', o.serving ? 'SERVING' : 'NOT SERVING', o.serving ? 'ok' : 'bad');
  setText('#version', o.version || 'dev');
  setText('#commit', o.commit || '–');
  setText('#goversion', o.go);
  setText('#uptime', fmtDuration(o.uptime_s));
  const q = o.rlqs;
  setText('#rlqs', !q ? 'off' : plural(q.streams, 'stream') + ', ' + plural(q.buckets, 'bucket') +
    (q.shared ? ' · demand shared through Redis' : ' · divided per replica'));

  const st = o.store;
  badge('#store-state', st.healthy ? 'healthy' : 'unhealthy', st.healthy ? 'ok' : 'bad');
  const dl = $('#store');
  const rows = [['Kind', st.kind]].concat(st.stats.map((s) => [s.name, s.value]));
  const sig = JSON.stringify(rows);
  if (dl.dataset.sig !== sig) {
    dl.dataset.sig = sig;
    dl.replaceChildren(...rows.flatMap(([k, v]) => [el('dt', null, k), el('dd', null, v)]));
  }

  const c = o.config;
  const src = c.source ? c.source.kind + ': ' + c.source.location + (c.source.version ? ' (version ' + c.source.version + ')' : '') : '–';
  setText('#config-source', src);
  setText('#config-loaded', c.last_success ? new Date(c.last_success).toLocaleString() : 'never');
  setText('#config-hash', c.hash ? c.hash.slice(0, 16) + '…' : '–');
  $('#config-hash').title = c.hash || '';
  setText('#config-size', c.loaded ? c.files + ' file(s), ' + c.domains + ' domain(s), ' + c.rules + ' rule(s)' : 'no config loaded');
  const names = (c.file_names || []).map((f) => f.split('/').pop());
  setText('#config-files', names.length ? names.join(', ') : '–');
  $('#config-files').title = (c.file_names || []).join('\n');
  setText('#config-loads', c.successes + ' ok, ' + c.failures + ' failed');
  if (!c.loaded) badge('#config-state', 'none', 'bad');
  else if (!c.last_ok) badge('#config-state', 'last load failed', 'warn');
  else badge('#config-state', 'ok', 'ok');

  const box = $('#config-error');
  box.hidden = !c.last_error;
  if (c.last_error) {
    const e = c.last_error;
    const items = problemItems(e);
    const sig = JSON.stringify(e);
    if (box.dataset.sig !== sig) {
      box.dataset.sig = sig;
      $('#config-problems').replaceChildren(...items);
    }
  }
  showOverlay(c.overlay);
  if (c.hash !== configHash) {
    configHash = c.hash;
    await refreshLimits();
  }
}

// problemItems lists load problems, each with its file:line.
function problemItems(e) {
  const items = e.problems.length
    ? e.problems.map((p) => el('li', null, el('code', null, p.file + (p.line ? ':' + p.line : '')), ' ', p.path ? p.path + ': ' : '', p.msg))
    : [el('li', null, e.message)];
  if (e.more) items.push(el('li', null, e.more + ' more'));
  return items;
}

// showOverlay shows the overlay on pushed limits (--xds-overlay): its
// load history and the entries that change no rule.
function showOverlay(o) {
  $('#overlay').hidden = !o;
  if (!o) return;
  setText('#overlay-size', o.files + ' file(s), ' + o.entries + ' entr' + (o.entries === 1 ? 'y' : 'ies') +
    ', ' + o.unmatched.length + ' changing no rule');
  setText('#overlay-loads', o.successes + ' ok, ' + o.failures + ' failed');
  if (!o.last_ok) badge('#overlay-state', 'last load failed', 'warn');
  else if (o.unmatched.length || o.problems.length) badge('#overlay-state', 'entries not applied', 'warn');
  else badge('#overlay-state', 'ok', 'ok');
  $('#overlay-error').hidden = !o.last_error;
  if (o.last_error) $('#overlay-problems').replaceChildren(...problemItems(o.last_error));
  const misses = o.problems.concat(o.unmatched);
  $('#overlay-misses').hidden = !misses.length;
  $('#overlay-miss-list').replaceChildren(...misses.map((m) => el('li', null, el('code', null, m.file + ':' + m.line), ' ',
    m.match, ': ', m.rule ? 'not applied to ' + m.rule + ': ' : '', m.reason)));
}

// ---- Limits and live traffic -----------------------------------------------

// rows maps a rule's id (domain + "\n" + path) to its table row's cells.
let rows = new Map();
const history = 60;

async function refreshLimits() {
  const v = await getJSON('ui/api/limits');
  $('#lookup-domains').replaceChildren(...v.domains.map((d) => el('option', {value: d})));
  const tbody = $('#limits-table tbody');
  const next = new Map();
  const trs = v.rules.map((r) => {
    const opts = [];
    if (r.shadow_mode) opts.push(el('span', {class: 'pill shadow'}, 'shadow'));
    if (r.unlimited) opts.push(el('span', {class: 'pill unlimited'}, 'unlimited'));
    for (const n of r.replaces || []) opts.push(el('span', {class: 'pill'}, 'replaces ' + n));
    for (const f of r.flags || []) opts.push(el('span', {class: 'pill'}, f));
    if (r.overlay) {
      opts.push(el('span', {class: 'pill overlay', title: 'set by the overlay at ' + r.overlay.file + ':' + r.overlay.line},
        'overlay ' + r.overlay.file.split('/').pop() + ':' + r.overlay.line + ': ' + r.overlay.fields.join(', ')));
    }
    const cells = {
      allowed: el('td', {class: 'num allowed'}, '0'),
      denied: el('td', {class: 'num denied'}, '0'),
      spark: el('canvas', {class: 'spark', width: 120, height: 26}),
      near: el('td', {class: 'num'}, '0'),
      shadow: el('td', {class: 'num'}, '0'),
      values: el('span', {class: 'values'}),
      usage: el('span', {class: 'usage', title: 'Units (hits, charged tokens) used per the rule\'s unit over the last minute, ' +
        'against its limit; and the units charged after the fact, those recorded past the limit and those refunded'}),
      rlqs: el('span', {class: 'rlqs', title: 'Rate Limit Quota Service buckets under the rule, as of the last interval: ' +
        'the proxies (streams) and buckets reporting, the demand they reported and the sum of the shares assigned, ' +
        'against the limit of each group (one per counter key)'}),
    };
    const where = (r.file ? r.file.split('/').pop() : '') + (r.line ? ':' + r.line : '');
    const tr = el('tr', {'data-rule': r.domain + '/' + r.path},
      el('td', null, r.domain),
      el('td', {class: 'rule', title: where}, el('code', null, r.path), r.name ? el('span', {class: 'name'}, 'name: ' + r.name) : null, cells.usage, cells.values, cells.rlqs),
      el('td', {class: 'limit'}, r.limit),
      el('td', {class: 'nowrap'}, r.algorithm ? r.algorithm.replace('_', ' ') : '–'),
      el('td', null, ...opts),
      cells.allowed, cells.denied, el('td', null, cells.spark), cells.near, cells.shadow);
    tr.dataset.search = [r.domain, r.path, r.name, r.limit, r.algorithm, r.shadow_mode ? 'shadow' : '', r.unlimited ? 'unlimited' : ''].join(' ').toLowerCase();
    cells.tr = tr;
    cells.rule = r;
    cells.shadowMode = r.shadow_mode;
    next.set(r.domain + '\n' + r.path, cells);
    return tr;
  });
  rows = next;
  tbody.replaceChildren(...trs);
  setText('#limits-count', v.total + ' rule' + (v.total === 1 ? '' : 's') + ' in ' + v.domains.length + ' domain' + (v.domains.length === 1 ? '' : 's'));
  const tr = $('#limits-truncated');
  tr.hidden = !v.truncated;
  setText(tr, v.truncated ? 'Showing the first ' + v.rules.length + ' of ' + v.total + ' rules.' : '');
  applySearch();
  if (lastTraffic) showTraffic(lastTraffic);
  if (lastQuota) showQuota(lastQuota);
}

function applySearch() {
  const q = $('#search').value.trim().toLowerCase();
  let shown = 0;
  for (const c of rows.values()) {
    const hit = !q || q.split(/\s+/).every((w) => c.tr.dataset.search.includes(w));
    c.tr.hidden = !hit;
    if (hit) shown++;
  }
  $('#limits-empty').hidden = shown > 0 || rows.size === 0;
}

let lastTraffic = null;

async function refreshTraffic() {
  lastTraffic = await getJSON('ui/api/traffic');
  showTraffic(lastTraffic);
}

// mean of the last n points.
function recent(xs, n) {
  if (!xs || !xs.length) return 0;
  const s = xs.slice(-n);
  return s.reduce((a, b) => a + b, 0) / s.length;
}

function showTraffic(t) {
  const seen = new Set();
  for (const r of t.rules) {
    const c = rows.get(r.domain + '\n' + r.rule);
    if (!c) continue;
    seen.add(c);
    const within = recent(r.within_per_s, 5), over = recent(r.over_per_s, 5);
    setText(c.allowed, fmtRate(within));
    setText(c.denied, fmtRate(over));
    c.denied.classList.toggle('hot', over > 0 && !c.shadowMode);
    c.denied.classList.toggle('warn', over > 0 && c.shadowMode);
    c.tr.classList.toggle('active', within > 0);
    setText(c.near, String(r.window.near));
    setText(c.shadow, String(r.window.shadow));
    c.tr.title = 'since start: ' + r.total.within + ' allowed, ' + r.total.over + ' over the limit';
    setText(c.values, r.values ? r.values.map((v) => v.value + ' (' + (v.total.within + v.total.over) + ')').join(', ') : '');
    setText(c.usage, usage(c.rule, r, t.interval_s));
    spark(c.spark, r.within_per_s || [], r.over_per_s || [], c.shadowMode ? '#d97706' : '#dc2626');
  }
  for (const c of rows.values()) {
    if (seen.has(c)) continue;
    setText(c.allowed, '0'); setText(c.denied, '0'); setText(c.near, '0'); setText(c.shadow, '0'); setText(c.usage, '');
    c.denied.classList.remove('hot', 'warn'); c.tr.classList.remove('active');
    if (c.spark.drawn) spark(c.spark, [], []);
  }
}

// spark draws allowed (green, filled) and denied (a line of overColor)
// per second over the last minute, right-aligned.
function spark(cv, within, over, overColor) {
  const dpr = window.devicePixelRatio || 1;
  const w = 120, h = 26;
  if (cv.width !== w * dpr) { cv.width = w * dpr; cv.height = h * dpr; }
  const g = cv.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  g.fillStyle = '#eef2f7';
  g.fillRect(0, h - 1, w, 1);
  const top = Math.max(1, ...within, ...over);
  const x = (i, n) => w - (n - 1 - i) * (w / (history - 1));
  const y = (v) => h - 2 - (v / top) * (h - 4);
  cv.drawn = within.length > 0;
  if (within.length > 1) {
    g.beginPath();
    g.moveTo(x(0, within.length), h - 1);
    within.forEach((v, i) => g.lineTo(x(i, within.length), y(v)));
    g.lineTo(w, h - 1);
    g.closePath();
    g.fillStyle = 'rgba(5,150,105,.18)';
    g.fill();
    g.beginPath();
    within.forEach((v, i) => (i ? g.lineTo : g.moveTo).call(g, x(i, within.length), y(v)));
    g.strokeStyle = '#059669'; g.lineWidth = 1.5; g.stroke();
  }
  if (over.length > 1 && over.some((v) => v > 0)) {
    g.beginPath();
    over.forEach((v, i) => (i ? g.lineTo : g.moveTo).call(g, x(i, over.length), y(v)));
    g.strokeStyle = overColor; g.lineWidth = 1.5; g.stroke();
  }
}

// ---- RLQS buckets per rule ---------------------------------------------------

let lastQuota = null;

async function refreshQuota() {
  lastQuota = await getJSON('ui/api/rlqs');
  showQuota(lastQuota);
}

function plural(n, word) {
  return n + ' ' + word + (n === 1 ? '' : 's');
}

// showQuota fills each rule's RLQS line, under its path: its proxies and
// buckets, the demand and the assigned shares against the limit of its
// groups, and for a detailed_metric rule its bucket ids. Empty (hidden)
// without buckets.
function showQuota(v) {
  const seen = new Set();
  for (const r of v.rules) {
    const c = rows.get(r.domain + '\n' + r.rule);
    if (!c) continue;
    seen.add(c);
    const per = r.per.replace('*', ' ');
    const detail = r.groups
      ? 'demand ' + fmtRate(r.demand) + (r.unmeasured ? ' (+' + r.unmeasured + ' new)' : '') + ' · assigned ' + Math.round(r.assigned).toLocaleString() + ' of ' +
        (r.groups > 1 ? r.groups + ' × ' : '') + r.limit.toLocaleString() + ' per ' + per
      : 'no limit divided: answered allow all or deny all';
    const ids = (r.bucket_ids || []).map((b) => Object.entries(b).map(([k, x]) => k + '=' + x).join(' ')).join(', ');
    const sig = JSON.stringify([r, v.shared]);
    if (c.rlqs.dataset.sig === sig) continue;
    c.rlqs.dataset.sig = sig;
    c.rlqs.replaceChildren(el('b', null, 'RLQS'), ' ' + (r.streams === 1 ? '1 proxy' : r.streams + ' proxies') + ' · ' +
      plural(r.buckets, 'bucket') + ' · ' + detail + (v.shared ? ' (this replica; limit shared through Redis)' : '') +
      (ids ? ' · ' + ids : ''));
  }
  for (const c of rows.values()) {
    if (seen.has(c) || !c.rlqs.dataset.sig) continue;
    c.rlqs.dataset.sig = '';
    c.rlqs.replaceChildren();
  }
}

// ---- Demo -------------------------------------------------------------------

const unitSeconds = {second: 1, minute: 60, hour: 3600, day: 86400, week: 604800, month: 2592000, year: 31536000};

function visitorID() {
  let id = sessionStorage.getItem('sluice-demo-visitor');
  if (!id) {
    const b = crypto.getRandomValues(new Uint8Array(8));
    id = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
    sessionStorage.setItem('sluice-demo-visitor', id);
  }
  return id;
}

const demo = {
  visitor: '',
  sent: 0,
  tb: {rule: null, at: 0, full: 0, n: 0}, // full: seconds until full at `at`
  fw: {rule: null, at: 0, used: 0, reset: 0, n: 0},
};

async function initDemo() {
  demo.visitor = visitorID();
  const v = await getJSON('ui/api/demo');
  for (const r of v.rules) {
    if (r.algorithm === 'token_bucket') demo.tb.rule = r;
    if (r.algorithm === 'fixed_window') demo.fw.rule = r;
  }
  const tb = demo.tb.rule, fw = demo.fw.rule;
  const rate = tb.requests_per_unit / unitSeconds[tb.unit];
  setText('#tb-desc', tb.burst + ' tokens, refilling ' + tb.requests_per_unit + ' per ' + tb.unit +
    ' (one every ' + (1 / rate) + ' s). A request takes a token; with none left it gets 429 until one refills.');
  setText('#fw-desc', fw.requests_per_unit + ' requests per ' + fw.unit + ', counted in windows aligned to the clock. ' +
    'Past the limit every request gets 429 until the window ends.');
  $('#tb-tokens').replaceChildren(...Array.from({length: tb.burst}, () => el('div', {class: 'token'}, el('div', {class: 'fill'}))));
  $('#fw-slots').replaceChildren(...Array.from({length: fw.requests_per_unit}, () => el('div', {class: 'slot'})));
  $('#demo-send').addEventListener('click', () => send(1));
  $('#demo-send10').addEventListener('click', () => send(10));
  setInterval(animate, 100);
  animate();
}

async function check(algorithm) {
  const body = {domain: 'demo', descriptors: [{entries: [{key: 'algorithm', value: algorithm}, {key: 'visitor', value: demo.visitor}]}]};
  const r = await fetch('ui/demo/v1/check', {method: 'POST', body: JSON.stringify(body), headers: {'Content-Type': 'application/json'}});
  const j = await r.json();
  return {status: r.status, retryAfter: r.headers.get('Retry-After'), body: j};
}

const secs = (d) => d ? parseFloat(d) : 0;

let sending = Promise.resolve();

// send queues n requests to each limit, one after the other.
function send(n) {
  sending = sending.then(async () => {
    for (let i = 0; i < n; i++) {
      demo.sent++;
      setText('#demo-sent', demo.sent + ' sent');
      try {
        const [tb, fw] = await Promise.all([check('token_bucket'), check('fixed_window')]);
        answer('tb', tb);
        answer('fw', fw);
      } catch (e) {
        setText('#tb-answer', 'No answer: ' + e.message);
        return;
      }
    }
  });
  return sending;
}

function answer(id, a) {
  const s = demo[id];
  const res = (a.body.results || [])[0] || {};
  const now = performance.now() / 1000;
  s.n++;
  s.at = now;
  if (id === 'tb') {
    s.full = secs(res.reset_after);
  } else {
    s.used = s.rule.requests_per_unit - (res.remaining || 0);
    s.reset = secs(res.reset_after);
  }
  const ok = a.status === 200;
  const text = ok
    ? '200 OK · ' + (res.remaining || 0) + ' left'
    : a.status === 429
      ? '429 Too Many Requests · Retry-After: ' + a.retryAfter + ' s'
      : a.status + ' ' + (a.body.error || '');
  const box = $('#' + id + '-answer');
  setText(box, text);
  box.className = 'answer ' + (ok ? 'ok' : 'denied');
  const panel = $('#' + id);
  panel.classList.remove('allowed', 'denied');
  void panel.offsetWidth;
  panel.classList.add(ok ? 'allowed' : 'denied');
  const log = $('#' + id + '-log');
  log.prepend(el('li', {class: ok ? 'ok' : 'denied'}, text));
  while (log.children.length > 20) log.lastChild.remove();
}

function animate() {
  const now = performance.now() / 1000;
  const tb = demo.tb, fw = demo.fw;
  if (tb.rule) {
    const rate = tb.rule.requests_per_unit / unitSeconds[tb.rule.unit];
    const full = Math.max(0, tb.full - (now - tb.at));
    const tokens = tb.n ? Math.max(0, tb.rule.burst - full * rate) : tb.rule.burst;
    setText('#tb-left', tokens.toFixed(1));
    $('#tb-tokens').querySelectorAll('.fill').forEach((f, i) => {
      f.style.height = (Math.min(1, Math.max(0, tokens - i)) * 100) + '%';
    });
  }
  if (fw.rule) {
    const period = unitSeconds[fw.rule.unit];
    const left = fw.n ? fw.reset - (now - fw.at) : -1;
    const used = left > 0 ? fw.used : 0;
    setText('#fw-count', used + ' / ' + fw.rule.requests_per_unit);
    setText('#fw-reset', left > 0 ? Math.ceil(left) + ' s' : '–');
    $('#fw-slots').querySelectorAll('.slot').forEach((e, i) => e.classList.toggle('used', i < used));
    $('#fw-bar').style.width = (left > 0 ? (1 - left / period) * 100 : 0) + '%';
  }
}

// ---- Look up a client -----------------------------------------------------
// The form posts what the operator typed to the server's lookup (JSON, so
// nothing lands in the URL or the history) and keeps it in no storage.

let lastLookup = null; // the request body of the last lookup, for a reset

function lookupStatus(c) {
  $('#lookup').hidden = !c.lookup;
  $('#lookup-nav').hidden = !c.lookup;
  $('#reset-form').hidden = !c.resets;
}

// lookupBody turns the form into a /v1/counters body: one descriptor of
// the comma-separated key=value entries.
function lookupBody() {
  const entries = [];
  for (const part of $('#lookup-entries').value.split(',')) {
    if (!part.trim()) continue;
    const i = part.indexOf('=');
    if (i <= 0) throw new Error('write the descriptor as key=value,key2=value2');
    entries.push({key: part.slice(0, i).trim(), value: part.slice(i + 1).trim()});
  }
  if (!entries.length) throw new Error('write the descriptor as key=value,key2=value2');
  return {domain: $('#lookup-domain').value.trim(), descriptors: [{entries}]};
}

async function postCounters(path, body, token) {
  const headers = {'Content-Type': 'application/json'};
  if (token) headers.Authorization = 'Bearer ' + token;
  const r = await fetch('ui/counters/v1/' + path, {method: 'POST', body: JSON.stringify(body), headers, cache: 'no-store'});
  const j = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error('HTTP ' + r.status + ': ' + (j.error || r.statusText));
  return j;
}

function lookupError(msg) {
  const e = $('#lookup-error');
  setText(e, msg || '');
  e.hidden = !msg;
}

function fmtSeconds(s) {
  if (s < 1) return Math.round(s * 1000) + ' ms';
  if (s < 10) return s.toFixed(1) + ' s';
  return fmtDuration(s);
}

function showCounters(res) {
  const d = res.descriptors[0];
  const desc = d.entries.map((e) => e.key + '=' + e.value).join(', ');
  const rule = !d.matched ? 'No rule matches [' + desc + '] in domain ' + res.domain + ': it is not limited.'
    : d.unlimited ? res.domain + '.' + d.path + ' matches [' + desc + ']: unlimited.'
    : d.override ? '[' + desc + '] carries a limit override.'
    : res.domain + '.' + d.path + (d.name ? ' (' + d.name + ')' : '') + ' matches [' + desc + '].';
  setText('#lookup-rule', rule);
  $('#lookup-table tbody').replaceChildren(...d.limits.map((l) => {
    const name = (l.name || l.path || 'override') + (l.shadow_mode ? ' (shadow)' : '');
    if (l.replaced) {
      return el('tr', null, el('td', null, name), el('td', null, l.algorithm), el('td', null, l.per),
        el('td', {colspan: '4', class: 'muted'}, 'replaced by another rule of the request'));
    }
    const next = l.never ? 'never (cost above the limit)' : l.allowed ? 'allowed' : 'denied for ' + fmtSeconds(l.retry_after_s);
    return el('tr', null, el('td', null, name), el('td', null, l.algorithm), el('td', null, l.per),
      el('td', {class: 'num used'}, l.used + ' / ' + l.limit), el('td', {class: 'num remaining'}, String(l.remaining)),
      el('td', {class: 'num'}, fmtSeconds(l.reset_after_s)), el('td', {class: l.allowed ? 'next' : 'next over'}, next));
  }));
  $('#lookup-table').hidden = !d.limits.length;
  $('#lookup-result').hidden = false;
}

async function lookup(ev) {
  ev.preventDefault();
  setText('#reset-answer', '');
  try {
    const body = lookupBody();
    const res = await postCounters('counters', body);
    lastLookup = body;
    lookupError('');
    showCounters(res);
  } catch (e) {
    lastLookup = null;
    $('#lookup-result').hidden = true;
    lookupError(e.message);
  }
}

async function resetCounters(ev) {
  ev.preventDefault();
  if (!lastLookup) return;
  const tok = $('#reset-token');
  try {
    const res = await postCounters('counters/reset', lastLookup, tok.value);
    tok.value = '';
    setText('#reset-answer', 'Reset at ' + new Date().toLocaleTimeString() + '.');
    showCounters(res);
  } catch (e) {
    setText('#reset-answer', 'Not reset: ' + e.message);
  }
}

// ---- Polling -----------------------------------------------------------------

// every runs fn now and then every ms milliseconds after it settles; a
// failure shows the connection banner until a call succeeds.
function every(ms, fn) {
  const tick = async () => {
    try {
      await fn();
      $('#conn').hidden = true;
    } catch (e) {
      $('#conn').hidden = false;
    }
    setTimeout(tick, ms);
  };
  tick();
}

document.addEventListener('DOMContentLoaded', () => {
  $('#search').addEventListener('input', applySearch);
  $('#lookup-form').addEventListener('submit', lookup);
  $('#reset-form').addEventListener('submit', resetCounters);
  every(2000, refreshOverview);
  every(1000, refreshTraffic);
  every(1000, refreshQuota);
  initDemo().catch(() => { $('#conn').hidden = false; });
});
