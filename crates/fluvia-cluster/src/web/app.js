/* Fluvia Web UI — app.js
 *
 * Owns everything the dashboard does in the browser: the hash router (#/, #/jobs/<jid>,
 * #/jobs/<jid>/vertices/<vid>, #/taskmanagers), the polling loop (period = /config
 * "refresh-interval", paused while the tab is hidden), and rendering of the cluster header,
 * the job list, the job page (a left-to-right SVG DAG with its own small layered layout, fitted
 * to the card's width with zoom buttons, the vertex panel, exceptions, configuration) and the
 * TaskManagers page.
 * It only talks to the JobManager REST API (docs/cluster.md), same origin, no libraries.
 * Every string that comes from the server is escaped (esc) before it is put into HTML or SVG.
 * Updates are in place: containers keep their last HTML and are only rewritten when it changed,
 * table rows are patched by key, so selection, open stack traces and scroll positions survive.
 */
'use strict';

/* ------------------------------------------------------------------ utilities */

const $ = (sel, root = document) => root.querySelector(sel);
const enc = encodeURIComponent;
const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
const esc = (v) => String(v ?? '').replace(/[&<>"']/g, (c) => ESC[c]);
const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
const FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", "Liberation Sans", "DejaVu Sans", sans-serif';
const TERMINAL = new Set(['FINISHED', 'FAILED', 'CANCELED', 'SUSPENDED']);
const TASK_STATES = ['CREATED', 'SCHEDULED', 'DEPLOYING', 'INITIALIZING', 'RUNNING', 'FINISHED',
  'CANCELING', 'CANCELED', 'FAILED', 'RECONCILING'];

function fmtCount(n) { return isNum(n) && n >= 0 ? Math.round(n).toLocaleString('en-US') : '–'; }
function fmtCompact(n) {
  if (!isNum(n) || n < 0) return '–';
  const u = ['', 'K', 'M', 'G', 'T', 'P'];
  let i = 0;
  while (n >= 1000 && i < u.length - 1) { n /= 1000; i++; }
  return (i === 0 ? String(Math.round(n)) : n.toFixed(n < 10 ? 2 : n < 100 ? 1 : 0)) + (i ? ' ' + u[i] : '');
}
function fmtBytes(n) {
  if (!isNum(n) || n < 0) return '–';
  const u = ['B', 'KB', 'MB', 'GB', 'TB', 'PB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i === 0 ? String(Math.round(n)) : n.toFixed(n < 10 ? 1 : 0)) + ' ' + u[i];
}
function fmtDuration(ms) {
  if (!isNum(ms) || ms < 0) return '–';
  if (ms < 1000) return Math.round(ms) + ' ms';
  let s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d) return `${d}d ${h}h ${m}m`;
  if (h) return `${h}h ${m}m ${s}s`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}
function fmtTime(ms) {
  if (!isNum(ms) || ms <= 0) return '–';
  const d = new Date(ms), p = (x) => String(x).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}
/** Time of day only when it is today, else the full date and time. */
function fmtClock(ms) {
  const full = fmtTime(ms);
  return isNum(ms) && ms > 0 && new Date(ms).toDateString() === new Date().toDateString() ? full.slice(11) : full;
}
/** A count the server may not know (-1, missing): shown as "–". */
const known = (v) => (isNum(v) && v >= 0 ? v : '–');
function fmtMsPerSec(v) { return isNum(v) ? `${Math.round(v)} ms/s` : '–'; }
function pct(msPerSec) { return isNum(msPerSec) ? Math.max(0, Math.min(100, Math.round(msPerSec / 10))) : null; }
const shortId = (id) => String(id ?? '').slice(0, 8);
const stCls = (s) => 'st-' + String(s || 'UNKNOWN').toUpperCase().replace(/[^A-Z_]/g, '');
const badge = (s) => `<span class="badge ${stCls(s)}">${esc(s || 'UNKNOWN')}</span>`;
const firstLine = (t) => String(t ?? '').split('\n', 1)[0];

/** Duration that keeps counting in the browser (updated by the 1 s ticker). */
function liveDuration(start, end, duration) {
  if (isNum(start) && start > 0 && !(isNum(end) && end > 0)) {
    return `<span class="live" data-start="${start}">${esc(fmtDuration(serverNow() - start))}</span>`;
  }
  return esc(fmtDuration(duration));
}

/** Task counters as in Flink's job list: one small coloured box per non-empty state. */
function taskCounters(tasks) {
  if (!tasks) return '';
  const up = {};
  for (const [k, v] of Object.entries(tasks)) up[k.toUpperCase()] = v;
  const cells = TASK_STATES.filter((s) => up[s] > 0)
    .map((s) => `<span class="tc ${stCls(s)}" title="${s}">${esc(up[s])}</span>`);
  const total = isNum(up.TOTAL) ? `<span class="tc-total" title="total">${esc(up.TOTAL)}</span>` : '';
  return `<span class="tcs">${cells.join('')}${total}</span>`;
}

/** What a piece of HTML is compared by: live durations count in place, so their text is ignored. */
const sig = (html) => html.replace(/(<span class="live" data-start="\d+">)[^<]*/g, '$1');

/** Rewrites el only when the HTML differs from what we wrote last time. */
function setHTML(el, html) {
  if (el && el._html !== sig(html)) { el._html = sig(html); el.innerHTML = html; }
}

/** Updates a <tbody> in place from [{key, html}] (html = one whole <tr>), reusing unchanged rows. */
function patchRows(tbody, rows) {
  const old = new Map([...tbody.children].map((tr) => [tr.dataset.key, tr]));
  let prev = null;
  for (const { key, html } of rows) {
    let tr = old.get(key);
    if (!tr || tr._html !== sig(html)) {
      const t = document.createElement('template');
      t.innerHTML = html.trim();
      const n = t.content.firstElementChild;
      n.dataset.key = key; n._html = sig(html);
      if (tr) tr.replaceWith(n);
      tr = n;
    }
    old.delete(key);
    const want = prev ? prev.nextElementSibling : tbody.firstElementChild;
    if (want !== tr) tbody.insertBefore(tr, want);
    prev = tr;
  }
  for (const tr of old.values()) tr.remove();
}

/** GET/PATCH a REST path; throws Error(errors.join) for non-2xx answers. */
async function api(path, opts = {}) {
  const res = await fetch(path, { cache: 'no-store', ...opts });
  const text = await res.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
  if (!res.ok) {
    const errs = body && Array.isArray(body.errors) && body.errors.length ? body.errors : null;
    const e = new Error(errs ? errs.join('\n') : `${res.status} ${res.statusText || 'error'}`);
    e.status = res.status;
    throw e;
  }
  return body;
}

/** Awaits an object of promises; each result becomes {ok, value} or {ok:false, error}. */
async function settle(obj) {
  const keys = Object.keys(obj);
  const res = await Promise.allSettled(keys.map((k) => obj[k]));
  const out = {};
  keys.forEach((k, i) => {
    out[k] = res[i].status === 'fulfilled' ? { ok: true, value: res[i].value } : { ok: false, error: res[i].reason };
  });
  return out;
}
const errBox = (e) => `<div class="error">${esc(e && e.message ? e.message : e)}</div>`;

/* ------------------------------------------------------------------ state and loop */

const S = {
  refresh: 1000, secretRequired: false, canCancel: true,
  route: { page: 'jobs' }, page: null, gen: 0, timer: null,
  clockSkew: 0,               // server clock - browser clock (ms), from /jobs/<jid> "now"
  skewFromJob: false,         // true once a job's "now" gave the skew (better than the job list's guess)
  expandedTms: new Set(),
  openDetails: new Set(),      // keys of <details data-open-key> the user opened
};
const serverNow = () => Date.now() + S.clockSkew;

function setLoaded(name) { document.body.dataset.loaded = name; }

function schedule() {
  clearTimeout(S.timer);
  S.timer = setTimeout(tick, S.refresh);
}

async function tick() {
  clearTimeout(S.timer); S.timer = null;
  if (document.hidden) return;                 // resumed by visibilitychange
  const gen = S.gen;
  try { await Promise.all([refreshCluster(), S.page.refresh(gen)]); } catch (e) { console.error(e); }
  if (gen === S.gen && !document.hidden) schedule();
}

function parseRoute() {
  const h = (location.hash || '').replace(/^#/, '') || '/';
  let m;
  if ((m = h.match(/^\/jobs\/([^/]+)\/vertices\/([^/]+)\/?$/))) return { page: 'job', jid: decodeURIComponent(m[1]), vid: decodeURIComponent(m[2]) };
  if ((m = h.match(/^\/jobs\/([^/]+)\/?$/))) return { page: 'job', jid: decodeURIComponent(m[1]), vid: null };
  if (/^\/taskmanagers\/?$/.test(h)) return { page: 'taskmanagers' };
  return { page: 'jobs' };
}

function onRoute() {
  const prev = S.route, r = parseRoute();
  S.route = r;
  S.gen++;
  delete document.body.dataset.loaded;
  for (const a of document.querySelectorAll('nav a')) {
    a.classList.toggle('active', a.dataset.nav === (r.page === 'taskmanagers' ? 'taskmanagers' : 'jobs'));
  }
  if (S.page === JobPage && r.page === 'job' && prev.page === 'job' && prev.jid === r.jid) {
    JobPage.select(r.vid);                     // same job: keep the page, switch the panel
  } else {
    S.page = { jobs: JobsPage, job: JobPage, taskmanagers: TmPage }[r.page];
    S.page.mount($('#main'), r);
    window.scrollTo(0, 0);
  }
  tick();
}

/* ------------------------------------------------------------------ cluster header */

async function refreshCluster() {
  const el = $('#cluster');
  try {
    const o = await api('overview');
    const item = (label, value, cls = '') => `<span class="stat ${cls}"><b>${esc(value)}</b> ${esc(label)}</span>`;
    const blocked = o['taskmanagers-blocked'] || 0;
    setHTML(el, [
      item('TaskManagers', o.taskmanagers ?? '–'),
      item('slots available', `${o['slots-available'] ?? '–'} / ${o['slots-total'] ?? '–'}`),
      item('blocked TaskManagers', blocked, blocked ? 'warn' : ''),
      '<span class="sep"></span>',
      item('running', o['jobs-running'] ?? 0, 'j-run'),
      item('finished', o['jobs-finished'] ?? 0, 'j-fin'),
      item('cancelled', o['jobs-cancelled'] ?? 0, 'j-can'),
      item('failed', o['jobs-failed'] ?? 0, 'j-fail'),
    ].join(''));
    if (o['flink-version']) $('#version').textContent = o['flink-version'];
  } catch (e) {
    setHTML(el, `<span class="stat warn">JobManager unreachable: ${esc(e.message)}</span>`);
  }
}

/* ------------------------------------------------------------------ job list */

const JobsPage = {
  mount(root) {
    const table = (id, title) => `
      <section class="card">
        <div class="card-h"><h2>${title}</h2></div>
        <div class="tbl-wrap"><table class="tbl jobs"><colgroup><col><col style="width:100px"><col style="width:120px"><col style="width:165px"><col style="width:105px"><col style="width:165px"><col style="width:200px"></colgroup>
          <thead><tr><th>Name</th><th>Job ID</th><th>State</th><th>Start time</th><th>Duration</th><th>End time</th><th>Tasks</th></tr></thead>
          <tbody id="${id}"><tr class="empty"><td colspan="7">Loading…</td></tr></tbody>
        </table></div>
      </section>`;
    root.innerHTML = table('jobs-running', 'Running jobs') + table('jobs-done', 'Completed jobs');
  },

  async refresh(gen) {
    let data;
    try { data = await api('jobs/overview'); } catch (e) {
      if (gen !== S.gen) return;
      setHTML($('#main'), `<section class="card">${errBox(e)}</section>`);
      return setLoaded('jobs');
    }
    if (gen !== S.gen) return;
    const jobs = (data && data.jobs) || [];
    const running = jobs.find((j) => !TERMINAL.has(j.state) && j['end-time'] <= 0 && isNum(j.duration));
    if (running && !S.skewFromJob) S.clockSkew = running['start-time'] + running.duration - Date.now();
    const byStart = (a, b) => (b['start-time'] || 0) - (a['start-time'] || 0);
    const row = (j) => ({
      key: j.jid,
      html: `<tr class="job" data-jid="${esc(j.jid)}" data-state="${esc(j.state)}" tabindex="0">
        <td class="name" title="${esc(j.name)}">${esc(j.name)}</td>
        <td class="mono" title="${esc(j.jid)}">${esc(shortId(j.jid))}</td>
        <td>${badge(j.state)}</td>
        <td>${esc(fmtTime(j['start-time']))}</td>
        <td>${TERMINAL.has(j.state) ? esc(fmtDuration(j.duration)) : liveDuration(j['start-time'], j['end-time'], j.duration)}</td>
        <td>${esc(fmtTime(j['end-time']))}</td>
        <td>${taskCounters(j.tasks)}</td></tr>`,
    });
    const fill = (id, list, empty) => {
      const rows = list.sort(byStart).map(row);
      patchRows($('#' + id), rows.length ? rows : [{ key: 'empty', html: `<tr class="empty"><td colspan="7">${empty}</td></tr>` }]);
    };
    fill('jobs-running', jobs.filter((j) => !TERMINAL.has(j.state)), 'No running jobs.');
    fill('jobs-done', jobs.filter((j) => TERMINAL.has(j.state)), 'No completed jobs.');
    setLoaded('jobs');
  },
};

/* ------------------------------------------------------------------ DAG layout */

let measureCtx = null;
function textWidth(text, font) {
  if (!measureCtx) measureCtx = document.createElement('canvas').getContext('2d');
  measureCtx.font = font;
  return measureCtx.measureText(text).width;
}

/** Breaks text into lines no wider than maxW; the lines concatenate back to the original text. */
function wrapText(text, font, maxW) {
  if (textWidth(text, font) <= maxW) return [text];
  const lines = [];
  let line = '';
  for (const tok of text.split(/(?<=[\s,(\[=>])/)) {
    if (line && textWidth(line + tok, font) > maxW) { lines.push(line); line = ''; }
    let t = tok;
    while (textWidth(t, font) > maxW && t.length > 1) {      // one token too long: hard break
      let n = t.length - 1;
      while (n > 1 && textWidth(line + t.slice(0, n), font) > maxW) n--;
      lines.push(line + t.slice(0, n)); line = ''; t = t.slice(n);
    }
    line += t;
  }
  if (line) lines.push(line);
  return lines;
}

/**
 * Places items (given in order) at tops as close as possible to `desired` without overlapping:
 * pool-adjacent-violators over blocks, so a crowded group centres on its wishes.
 */
function packColumn(desired, heights, gap) {
  const blocks = [];
  for (let i = 0; i < desired.length; i++) {
    let b = { first: i, n: 1, height: heights[i], sum: desired[i], top: desired[i] };
    while (blocks.length) {
      const p = blocks[blocks.length - 1];
      if (p.top + p.height + gap <= b.top) break;
      blocks.pop();
      const shift = p.height + gap;
      b = { first: p.first, n: p.n + b.n, height: p.height + gap + b.height, sum: p.sum + b.sum - shift * b.n };
      b.top = b.sum / b.n;
    }
    blocks.push(b);
  }
  const out = new Array(desired.length);
  for (const b of blocks) {
    let y = b.top;
    for (let i = b.first; i < b.first + b.n; i++) { out[i] = y; y += heights[i] + gap; }
  }
  return out;
}

/**
 * Layered left-to-right layout. nodes: [{id, w, h}], edges: [{source, target, labelW, labelH}].
 * 1. rank = longest path from the sources (sources with outputs are then pulled next to their
 *    first consumer); 2. edges spanning several ranks get dummy points; 3. order in each rank by
 *    barycenter sweeps, keeping the order with the fewest crossings; 4. y by repeatedly moving
 *    each node to the mean of its neighbours, packed without overlap; 5. columns are as wide as
 *    their widest box, gaps as wide as their widest edge label.
 * Returns {width, height, nodes: Map id -> {x,y,w,h}, edges: [{points:[...], label:{x,y}}]}.
 */
function layoutDag(nodes, edges) {
  const M = 16, GAP_Y = 26, DUMMY_H = 12;
  const byId = new Map(nodes.map((n) => [n.id, { ...n, preds: [], succs: [], real: true }]));
  const es = edges.filter((e) => byId.has(e.source) && byId.has(e.target) && e.source !== e.target);
  for (const e of es) { byId.get(e.target).preds.push(e.source); byId.get(e.source).succs.push(e.target); }

  const rank = new Map(), state = new Map();        // state: 1 on stack, 2 done (cycles are cut)
  const visit = (id) => {
    if (state.get(id) === 2) return rank.get(id);
    state.set(id, 1);
    let r = 0;
    for (const p of byId.get(id).preds) if (state.get(p) !== 1) r = Math.max(r, visit(p) + 1);
    state.set(id, 2); rank.set(id, r);
    return r;
  };
  for (const id of byId.keys()) visit(id);
  for (const [id, n] of byId) {
    if (!n.preds.length && n.succs.length) rank.set(id, Math.max(0, Math.min(...n.succs.map((s) => rank.get(s))) - 1));
  }
  const maxRank = Math.max(0, ...rank.values());

  // layers with dummy nodes; segs: adjacent-rank pieces of the real edges
  const layers = Array.from({ length: maxRank + 1 }, () => []);
  for (const n of byId.values()) { n.rank = rank.get(n.id); layers[n.rank].push(n); }
  const chains = es.map((e, ei) => {
    const chain = [e.source];
    let r0 = rank.get(e.source), r1 = rank.get(e.target);
    if (r1 <= r0) return null;                        // back edge of a cycle: not drawn
    for (let r = r0 + 1; r < r1; r++) {
      const d = { id: `~${ei}.${r}`, w: 0, h: DUMMY_H, preds: [], succs: [], real: false, rank: r };
      byId.set(d.id, d); layers[r].push(d); chain.push(d.id);
    }
    chain.push(e.target);
    return chain;
  });
  const segs = [];
  chains.forEach((ch) => {
    if (!ch) return;
    for (let i = 0; i + 1 < ch.length; i++) segs.push([ch[i], ch[i + 1]]);
  });
  const P = new Map(), Sx = new Map();               // adjacency over segments
  for (const n of byId.keys()) { P.set(n, []); Sx.set(n, []); }
  for (const [a, b] of segs) { Sx.get(a).push(b); P.get(b).push(a); }

  // ordering: barycenter sweeps, keep the best
  const pos = new Map();
  const index = () => layers.forEach((l) => l.forEach((n, i) => pos.set(n.id, i)));
  const crossings = () => {
    let c = 0;
    for (let r = 0; r < maxRank; r++) {
      const s = segs.filter(([a]) => byId.get(a).rank === r).map(([a, b]) => [pos.get(a), pos.get(b)]);
      for (let i = 0; i < s.length; i++) for (let j = i + 1; j < s.length; j++) {
        if ((s[i][0] - s[j][0]) * (s[i][1] - s[j][1]) < 0) c++;
      }
    }
    return c;
  };
  index();
  let best = layers.map((l) => l.slice()), bestC = crossings();
  for (let it = 0; it < 8 && bestC > 0; it++) {
    const down = it % 2 === 0;
    for (let k = 1; k <= maxRank; k++) {
      const r = down ? k : maxRank - k;
      const nb = down ? P : Sx;
      const bc = new Map(layers[r].map((n) => {
        const ps = nb.get(n.id);
        return [n.id, ps.length ? ps.reduce((s, p) => s + pos.get(p), 0) / ps.length : pos.get(n.id)];
      }));
      layers[r].sort((a, b) => bc.get(a.id) - bc.get(b.id));
      layers[r].forEach((n, i) => pos.set(n.id, i));
    }
    const c = crossings();
    if (c < bestC) { bestC = c; best = layers.map((l) => l.slice()); }
  }
  best.forEach((l, r) => { layers[r] = l; });
  index();

  // y coordinates
  const top = new Map();
  for (const l of layers) { let y = 0; for (const n of l) { top.set(n.id, y); y += n.h + GAP_Y; } }
  const center = (id) => top.get(id) + byId.get(id).h / 2;
  for (let it = 0; it < 10; it++) {
    const down = it % 2 === 0;
    for (let k = 0; k <= maxRank; k++) {
      const l = layers[down ? k : maxRank - k];
      const desired = l.map((n) => {
        const nb = [...P.get(n.id), ...Sx.get(n.id)];
        const pref = down ? P.get(n.id) : Sx.get(n.id);
        const use = pref.length ? pref : nb;
        return use.length ? use.reduce((s, p) => s + center(p), 0) / use.length - n.h / 2 : top.get(n.id);
      });
      const tops = packColumn(desired, l.map((n) => n.h), GAP_Y);
      l.forEach((n, i) => top.set(n.id, tops[i]));
    }
  }

  // x coordinates: column widths and label gaps
  const colW = layers.map((l) => Math.max(40, ...l.map((n) => n.w)));
  const gapW = Array.from({ length: maxRank }, () => 110);
  es.forEach((e, ei) => {
    if (!chains[ei]) return;
    const r = rank.get(e.source);
    gapW[r] = Math.max(gapW[r], e.labelW + 56);
  });
  const colX = [];
  let x = M;
  for (let r = 0; r <= maxRank; r++) { colX.push(x); x += colW[r] + (gapW[r] || 0); }
  const width = x + M;

  // ports: spread several edges over a box side, ordered by the other end's y
  const outPort = new Map(), inPort = new Map();
  const spread = (n, others, map, key) => {
    const k = others.length;
    const sorted = others.slice().sort((a, b) => center(a.other) - center(b.other));
    const span = Math.min(n.h - 24, (k - 1) * 14);
    sorted.forEach((o, i) => map.set(o[key], center(n.id) + (k > 1 ? -span / 2 + (span * i) / (k - 1) : 0)));
  };
  const segId = (a, b, i) => `${a}>${b}#${i}`;
  const segList = segs.map(([a, b], i) => ({ a, b, id: segId(a, b, i) }));
  for (const n of byId.values()) {
    if (!n.real) continue;
    spread(n, segList.filter((s) => s.a === n.id).map((s) => ({ other: s.b, id: s.id })), outPort, 'id');
    spread(n, segList.filter((s) => s.b === n.id).map((s) => ({ other: s.a, id: s.id })), inPort, 'id');
  }

  // edge geometry: [colRight, y] -> bezier -> [colLeft, y] per rank gap; plus box-to-column stubs
  let si = 0;
  const outEdges = es.map((e, ei) => {
    const ch = chains[ei];
    if (!ch) return null;
    const pts = [];
    for (let i = 0; i + 1 < ch.length; i++, si++) {
      const a = byId.get(ch[i]), b = byId.get(ch[i + 1]), id = segList[si].id;
      const ya = a.real ? outPort.get(id) : center(a.id), yb = b.real ? inPort.get(id) : center(b.id);
      const ra = a.rank, rb = b.rank;
      if (i === 0) pts.push({ x: colX[ra] + (colW[ra] + a.w) / 2, y: ya, move: true });
      pts.push({ x: colX[ra] + colW[ra], y: ya });
      pts.push({ x: colX[rb], y: yb, curve: true });
      pts.push({ x: b.real ? colX[rb] + (colW[rb] - b.w) / 2 : colX[rb] + colW[rb], y: yb });
    }
    const p0 = pts[1], p1 = pts[2];
    return { points: pts, label: { x: (p0.x + p1.x) / 2, y: (p0.y + p1.y) / 2, w: e.labelW, h: e.labelH, gap: rank.get(e.source) } };
  });

  // labels in the same gap must not overlap
  for (let r = 0; r < maxRank; r++) {
    const ls = outEdges.filter((o) => o && o.label.gap === r).map((o) => o.label).sort((a, b) => a.y - b.y);
    const tops = packColumn(ls.map((l) => l.y - l.h / 2), ls.map((l) => l.h), 6);
    ls.forEach((l, i) => { l.y = tops[i] + l.h / 2; });
  }

  // normalise to the margin
  let minY = Infinity, maxY = -Infinity;
  for (const n of byId.values()) { minY = Math.min(minY, top.get(n.id)); maxY = Math.max(maxY, top.get(n.id) + n.h); }
  for (const o of outEdges) if (o) { minY = Math.min(minY, o.label.y - o.label.h / 2); maxY = Math.max(maxY, o.label.y + o.label.h / 2); }
  if (!isFinite(minY)) { minY = 0; maxY = 0; }
  const dy = M - minY;
  const placed = new Map();
  for (const n of byId.values()) {
    if (n.real) placed.set(n.id, { x: colX[n.rank] + (colW[n.rank] - n.w) / 2, y: top.get(n.id) + dy, w: n.w, h: n.h });
  }
  for (const o of outEdges) if (o) { o.points.forEach((p) => { p.y += dy; }); o.label.y += dy; }
  return { width, height: maxY - minY + 2 * M, nodes: placed, edges: outEdges };
}

/** SVG path through layout points: straight stubs, cubic Béziers across the rank gaps. */
function pathD(pts) {
  let d = '';
  for (let i = 0; i < pts.length; i++) {
    const p = pts[i];
    if (p.move) d += `M${p.x.toFixed(1)},${p.y.toFixed(1)}`;
    else if (p.curve) {
      const q = pts[i - 1], mx = (q.x + p.x) / 2;
      d += `C${mx.toFixed(1)},${q.y.toFixed(1)} ${mx.toFixed(1)},${p.y.toFixed(1)} ${p.x.toFixed(1)},${p.y.toFixed(1)}`;
    } else d += `L${p.x.toFixed(1)},${p.y.toFixed(1)}`;
  }
  return d;
}

/* ------------------------------------------------------------------ DAG model and drawing */

const F_HEAD = `600 12.5px ${FONT}`, F_MEMBER = `12px ${FONT}`, F_META = `11px ${FONT}`;
const F_LBL = `600 11px ${FONT}`, F_LBL2 = `10.5px ${FONT}`;
const BOX_MIN = 190, BOX_TEXT_MAX = 290, PAD = 10, LINE = 16;

/**
 * Short title of a multiple-input vertex: "MultipleInput" plus the bracketed sources that follow
 * "MultipleInput(readOrder=[..], members=[..])" in its name, e.g. "MultipleInput [Source: store_sales]".
 * The members and the read order are listed below it, the full name is in the box's tooltip.
 */
function multipleInputTitle(name) {
  const s = String(name ?? '');
  const at = s.lastIndexOf('])');                   // closes the members' list, as the server reads it
  const tail = at >= 0 ? s.slice(at + 2).trim() : '';
  return /^\[[^\n]*\]$/.test(tail) ? `MultipleInput ${tail}` : 'MultipleInput';
}

/** Text lines of a vertex box: chained members head first, or a MultipleInput with its members. */
function vertexLines(node, vertex) {
  const members = Array.isArray(node.members) && node.members.length ? node.members.map(String)
    : [String(vertex?.name ?? node.description ?? node.operator ?? node.id)];
  const mi = node['multiple-input'];
  if (!mi) return members.map((m, i) => ({ text: m, font: i === 0 ? F_HEAD : F_MEMBER, cls: i === 0 ? 'm-head' : 'm' }));
  const miMembers = (mi.members || []).map(String);
  const isMi = (m) => m.startsWith('MultipleInput');
  const full = members.find((m) => m.startsWith('MultipleInput(')) ?? [vertex?.name, node.description]
    .map((x) => String(x ?? '')).find((x) => x.startsWith('MultipleInput(')) ?? '';
  const lines = [{ text: multipleInputTitle(full), font: F_HEAD, cls: 'm-head' }];
  miMembers.forEach((m) => lines.push({ text: m, font: F_MEMBER, cls: 'm mi', indent: 10 }));
  if (Array.isArray(mi['read-order'])) lines.push({ text: `Read order: ${mi['read-order'].join(', ')}`, font: F_META, cls: 'meta' });
  const same = members.length === miMembers.length && members.every((m, i) => m === miMembers[i]);
  if (!same) members.filter((m) => !isMi(m)).forEach((m) => lines.push({ text: m, font: F_MEMBER, cls: 'm' }));
  return lines;
}

/** Builds the drawable model (boxes sized to their text, edges with labels) from /jobs/<jid>. */
function dagModel(job) {
  const vertices = job.vertices || [];
  const vmap = new Map(vertices.map((v) => [v.id, v]));
  const planNodes = (job.plan && job.plan.nodes) || [];
  const pmap = new Map(planNodes.map((n) => [n.id, n]));
  const ids = [...vertices.map((v) => v.id), ...planNodes.map((n) => n.id).filter((id) => !vmap.has(id))];
  const nodes = ids.map((id) => {
    const v = vmap.get(id), n = pmap.get(id) || { id, inputs: [] };
    const par = isNum(v?.parallelism) ? v.parallelism : isNum(n.parallelism) ? n.parallelism : -1;
    const lines = [], full = vertexLines(n, v);
    for (const l of full) {
      wrapText(l.text, l.font, BOX_TEXT_MAX - (l.indent || 0)).forEach((t, i) => lines.push({ ...l, text: t, cont: i > 0 }));
    }
    const parText = `Parallelism: ${par === -1 ? 'decided at runtime' : par}`;
    const textW = Math.max(...lines.map((l) => textWidth(l.text, l.font) + (l.indent || 0)), textWidth(parText, F_META) + 90);
    const w = Math.ceil(Math.max(BOX_MIN, textW + 2 * PAD));
    const h = 8 + PAD + lines.length * LINE + 8 + 16 + 2 * 16 + PAD - 4;
    return { id, w, h, v, n, lines, full: full.map((l) => l.text), par, parText };
  });
  const known = new Set(ids), edges = [];
  for (const nd of nodes) {
    const mi = nd.n['multiple-input'];
    for (const input of nd.n.inputs || []) {
      if (!known.has(input.id)) continue;
      const ship = input.ship_strategy || '';
      const lines = [{ text: ship || input.exchange || 'unknown', font: F_LBL }];
      if (isNum(input.records) || isNum(input.bytes)) lines.push({ text: `${fmtCompact(input.records)} records · ${fmtBytes(input.bytes)}`, font: F_LBL2 });
      if (mi && Array.isArray(mi['read-order']) && isNum(input.num)) lines.push({ text: `input ${input.num} · read order ${mi['read-order'][input.num] ?? '?'}`, font: F_LBL2 });
      const labelW = Math.ceil(Math.max(...lines.map((l) => textWidth(l.text, l.font))) + 14);
      edges.push({ source: input.id, target: nd.id, ship, input, lines, labelW, labelH: lines.length * 13 + 8 });
    }
  }
  return { nodes, edges };
}

/** Tooltip of an edge: its exchange, and that its numbers are what the producer wrote into it so far. */
function edgeTip(e) {
  const i = e.input, t = [`${e.ship || 'unknown'} · ${i.exchange || 'unknown exchange'} · input ${i.num ?? '?'}`];
  if (isNum(i.records) || isNum(i.bytes)) {
    t.push(`${fmtCount(i.records)} records · ${fmtBytes(i.bytes)}: what the producer has written into this edge so far`);
  }
  return t.join('\n');
}

function bar(y, label, value, cls, boxW) {
  const p = pct(value);
  const x = PAD + Math.ceil(textWidth('Back pressure', F_META)) + 8, w = boxW - PAD - x - 34;
  return `<text class="meta" x="${PAD}" y="${y + 9}">${label}</text>
    <rect class="bar-bg" x="${x}" y="${y + 1}" width="${w}" height="9" rx="2"/>
    <rect class="bar ${cls}" x="${x}" y="${y + 1}" width="${p === null ? 0 : (w * p) / 100}" height="9" rx="2"/>
    <text class="meta" x="${boxW - PAD}" y="${y + 9}" text-anchor="end">${p === null ? '–' : p + '%'}</text>`;
}

/** Renders the whole SVG for a model + layout; selected = vertex id or null; scale = zoom (1 = 100%). */
function dagSvg(model, lay, selected, scale = 1) {
  const boxes = model.nodes.map((nd) => {
    const p = lay.nodes.get(nd.id);
    const v = nd.v || {};
    const status = v.status || 'CREATED';
    let y = 8 + PAD;
    const texts = nd.lines.map((l) => {
      y += LINE;
      return `<text class="${l.cls}" x="${PAD + (l.indent || 0)}" y="${y - 4}">${esc(l.text)}</text>`;
    }).join('');
    y += 8;
    const sepY = y - 4;
    y += 16;
    const meta = `<text class="meta" x="${PAD}" y="${y - 4}">${esc(nd.parText)}</text>
      <text class="status-t" x="${nd.w - PAD}" y="${y - 4}" text-anchor="end">${esc(status)}</text>`;
    const busyLabel = status === 'FINISHED' ? 'Busy (avg)' : 'Busy';     // a finished attempt's average, not live
    const bars = bar(y, busyLabel, v['busy-ms-per-second'], 'busy', nd.w) + bar(y + 16, 'Back pressure', v['back-pressured-ms-per-second'], 'bp', nd.w);
    const name = String(v.name || nd.n.description || nd.id);
    const tip = [name, ...nd.full.filter((t) => t !== name), nd.parText].join('\n');
    return `<g class="vertex" data-vertex-id="${esc(nd.id)}" data-parallelism="${nd.par}" data-status="${esc(status)}"${selected === nd.id ? ' data-selected="true"' : ''} transform="translate(${p.x.toFixed(1)},${p.y.toFixed(1)})" tabindex="0" role="button">
      <title>${esc(tip)}</title>
      <rect class="box ${stCls(status)}" width="${nd.w}" height="${nd.h}" rx="6"/>
      <rect class="strip ${stCls(status)}" width="${nd.w}" height="6" rx="3"/>
      ${texts}<line class="sep" x1="${PAD}" x2="${nd.w - PAD}" y1="${sepY}" y2="${sepY}"/>${meta}${bars}</g>`;
  }).join('');
  const edges = model.edges.map((e, i) => {
    const g = lay.edges[i];
    if (!g) return '';
    const L = g.label, x0 = L.x - L.w / 2, y0 = L.y - L.h / 2;
    const active = selected && (e.source === selected || e.target === selected);
    const texts = e.lines.map((l, k) => `<text class="${k ? 'l2' : 'l1'}" x="${L.x.toFixed(1)}" y="${(y0 + 15 + k * 13).toFixed(1)}" text-anchor="middle">${esc(l.text)}</text>`).join('');
    return `<g class="edge" data-source="${esc(e.source)}" data-target="${esc(e.target)}" data-ship-strategy="${esc(e.ship)}"${active ? ' data-active="true"' : ''}>
      <title>${esc(edgeTip(e))}</title>
      <path d="${pathD(g.points)}" marker-end="url(#${active ? 'arrow-a' : 'arrow'})"/>
      <rect class="lbl" x="${x0.toFixed(1)}" y="${y0.toFixed(1)}" width="${L.w}" height="${L.h}" rx="4"/>${texts}</g>`;
  }).join('');
  const marker = (id) => `<marker id="${id}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0L10,5L0,10z"/></marker>`;
  const W = Math.ceil(lay.width), H = Math.ceil(lay.height);
  return `<svg class="dag" xmlns="http://www.w3.org/2000/svg" width="${Math.ceil(W * scale)}" height="${Math.ceil(H * scale)}" viewBox="0 0 ${W} ${H}">
    <defs>${marker('arrow')}${marker('arrow-a')}</defs><g class="vertices">${boxes}</g><g class="edges">${edges}</g></svg>`;
}

/* ------------------------------------------------------------------ job page */

const FIT_MIN = 0.35, ZOOM_MIN = 0.2, ZOOM_MAX = 2, ZOOM_STEP = 1.25;

const JobPage = {
  mount(root, r) {
    Object.assign(this, { jid: r.jid, vid: r.vid, job: null, exc: null, chk: null, cfg: null, vertex: null, bp: null,
      vertexFor: null, layoutKey: '', sizes: new Map(), model: null, layout: null, terminalTicks: 0, frozen: false, metricsFallback: null,
      zoom: null, scale: null, fit: null, viewPlaced: false });   // zoom: null = fit to the card's width, else the user's scale
    root.innerHTML = `
      <section class="card" id="job-head"><div class="muted">Loading job ${esc(r.jid)}…</div></section>
      <div id="cancel-msg" class="msg" hidden></div>
      <section class="card"><div class="card-h"><h2>Job graph</h2>
        <div class="zoom" role="group" aria-label="Zoom">
          <button type="button" data-action="zoom-out" title="Zoom out">−</button><button type="button" data-action="zoom-fit" title="Fit the graph to the width (and show its start)">Fit</button><button type="button" data-action="zoom-in" title="Zoom in">+</button>
          <span class="zoom-pct" id="zoom-pct"></span></div>
        <div class="legend">${
        ['CREATED', 'SCHEDULED', 'RUNNING', 'FINISHED', 'CANCELING', 'CANCELED', 'FAILED'].map((s) => `<span><i class="${stCls(s)}"></i>${s}</span>`).join('')
      }</div></div><div class="dag-scroll" id="dag"></div></section>
      <div id="vertex-slot"></div>
      <section class="card" id="checkpoints" hidden></section>
      <section class="card" id="exceptions"></section>
      <section class="card" id="config"></section>`;
  },

  /** Same job, another (or no) vertex: keep everything, swap the panel. */
  select(vid) {
    this.vid = vid;
    this.renderDag();                          // selection highlight; the layout is cached
    this.renderPanel();
  },

  async refresh(gen) {
    const jid = this.jid, vid = this.vid, base = `jobs/${enc(jid)}`;
    const fetchJob = !this.frozen || !this.job;
    const req = {};
    if (fetchJob) {
      req.job = api(base); req.exc = api(`${base}/exceptions`);
      // Only streaming jobs take checkpoints (a batch job's would be a 404).
      if (this.job && this.job['job-type'] === 'STREAMING') req.chk = api(`${base}/checkpoints`);
    }
    if (!this.cfg) req.cfg = api(`${base}/config`);
    if (vid && (fetchJob || this.vertexFor !== vid)) {
      req.vertex = api(`${base}/vertices/${enc(vid)}`);
      req.bp = api(`${base}/vertices/${enc(vid)}/backpressure`);
    }
    const res = await settle(req);
    if (gen !== S.gen) return;
    if (res.job) {
      if (!res.job.ok) {
        setHTML($('#job-head'), `<h2>Job ${esc(jid)}</h2>${errBox(res.job.error)}`);
        return setLoaded(vid ? 'vertex' : 'job');
      }
      this.job = res.job.value;
      if (isNum(this.job.now)) { S.clockSkew = this.job.now - Date.now(); S.skewFromJob = true; }
      await this.fillMissingMetrics(base, gen);
      if (gen !== S.gen) return;
    }
    if (res.exc) this.exc = res.exc;
    if (res.chk) this.chk = res.chk;
    if (res.cfg) this.cfg = res.cfg;
    if (res.vertex) { this.vertex = res.vertex; this.bp = res.bp; this.vertexFor = vid; }
    this.renderHead();
    this.renderDag();
    this.renderPanel();
    this.renderCheckpoints();
    this.renderExceptions();
    this.renderConfig();
    if (TERMINAL.has(this.job.state) && fetchJob && ++this.terminalTicks >= 2) this.frozen = true;
    setLoaded(vid ? 'vertex' : 'job');
  },

  /** Vertices without busy/back-pressure fields: ask the aggregated subtask metrics instead. */
  async fillMissingMetrics(base, gen) {
    const missing = (this.job.vertices || []).filter((v) => !('busy-ms-per-second' in v));
    if (!missing.length || this.metricsFallback === false) return;
    const q = 'subtasks/metrics?get=busyTimeMsPerSecond,backPressuredTimeMsPerSecond&agg=max';
    const res = await Promise.allSettled(missing.map((v) => api(`${base}/vertices/${enc(v.id)}/${q}`)));
    res.forEach((r, i) => {
      if (r.status !== 'fulfilled' || !Array.isArray(r.value)) return;
      for (const m of r.value) {
        if (m.id === 'busyTimeMsPerSecond') missing[i]['busy-ms-per-second'] = m.max;
        if (m.id === 'backPressuredTimeMsPerSecond') missing[i]['back-pressured-ms-per-second'] = m.max;
      }
    });
    if (res.every((r) => r.status === 'rejected')) this.metricsFallback = false;
  },

  renderHead() {
    const j = this.job;
    const cancellable = S.canCancel && !TERMINAL.has(j.state);
    const field = (k, v) => `<div><dt>${k}</dt><dd>${v}</dd></div>`;
    setHTML($('#job-head'), `
      <div class="job-title"><h2 title="${esc(j.name)}">${esc(j.name)}</h2>${badge(j.state)}
        <span class="grow"></span>
        ${cancellable ? `<button class="danger" data-action="cancel"${j.state === 'CANCELLING' ? ' disabled' : ''}>${j.state === 'CANCELLING' ? 'Cancelling…' : 'Cancel job'}</button>` : ''}</div>
      <dl class="facts">
        ${field('Job ID', `<span class="mono">${esc(j.jid)}</span>`)}
        ${field('Job type', esc(j['job-type'] || (j.plan && j.plan.type) || '–'))}
        ${field('Start time', esc(fmtTime(j['start-time'])))}
        ${field('End time', esc(fmtTime(j['end-time'])))}
        ${field('Duration', TERMINAL.has(j.state) ? esc(fmtDuration(j.duration)) : liveDuration(j['start-time'], j['end-time'], j.duration))}
        ${field('Vertices', taskCounters(j['status-counts']) || '–')}
      </dl>
      ${j.error ? `<div class="error"><b>Failure cause:</b> ${esc(j.error)}</div>` : ''}`);
  },

  renderDag() {
    const el = $('#dag');
    if (!this.job || !el) return;
    const model = dagModel(this.job);
    // sizes only grow while the page is open, so changing numbers do not make the layout jitter
    for (const n of model.nodes) {
      const m = this.sizes.get(n.id) || { w: 0, h: 0 };
      n.w = Math.max(n.w, m.w); n.h = Math.max(n.h, m.h); this.sizes.set(n.id, { w: n.w, h: n.h });
    }
    for (const e of model.edges) {
      const k = `${e.source}>${e.target}#${e.input.num}`, m = this.sizes.get(k) || { w: 0, h: 0 };
      e.labelW = Math.max(Math.ceil(e.labelW / 8) * 8, m.w); e.labelH = Math.max(e.labelH, m.h);
      this.sizes.set(k, { w: e.labelW, h: e.labelH });
    }
    const key = JSON.stringify([model.nodes.map((n) => [n.id, n.w, n.h]), model.edges.map((e) => [e.source, e.target, e.labelW, e.labelH])]);
    if (key !== this.layoutKey) { this.layout = layoutDag(model.nodes, model.edges); this.layoutKey = key; }
    this.model = model;
    const left = el.scrollLeft, top = el.scrollTop, cw = el.clientWidth, ch = el.clientHeight;
    const prev = this.scale, scale = this.zoom ?? this.fitScale(el);
    const focused = document.activeElement && document.activeElement.closest && document.activeElement.closest('#dag g.vertex');
    setHTML(el, model.nodes.length ? dagSvg(model, this.layout, this.vid, scale) : '<div class="muted pad">This job has no vertices.</div>');
    this.scale = scale;
    if (!model.nodes.length) { /* nothing to place */ } else if (!this.viewPlaced) {
      this.placeView(el); this.viewPlaced = true;
    } else if (prev && prev !== scale) {           // zoomed: keep the point in the middle of the view
      el.scrollLeft = ((left + cw / 2) / prev) * scale - el.clientWidth / 2;
      el.scrollTop = ((top + ch / 2) / prev) * scale - el.clientHeight / 2;
    } else { el.scrollLeft = left; el.scrollTop = top; }
    const p = $('#zoom-pct');
    if (p) p.textContent = model.nodes.length ? `${Math.round(scale * 100)}%` : '';
    for (const [a, dis] of [['zoom-out', scale <= ZOOM_MIN], ['zoom-in', scale >= ZOOM_MAX]]) {
      const b = document.querySelector(`#main [data-action="${a}"]`);
      if (b) b.disabled = dis;
    }
    if (focused) { const g = [...el.querySelectorAll('g.vertex')].find((x) => x.dataset.vertexId === focused.dataset.vertexId); if (g) g.focus({ preventScroll: true }); }
  },

  /**
   * Scale at which the graph fits the scroll box's width: at most 1, at least FIT_MIN (then it scrolls).
   * Kept while the graph's size stays, it still fits and the box did not widen by more than a scroll
   * bar, so a page scroll bar coming and going does not rescale the graph back and forth on refreshes.
   */
  fitScale(el) {
    const W = Math.ceil(this.layout.width), H = Math.ceil(this.layout.height);
    const cs = getComputedStyle(el);
    const inner = el.offsetWidth - (parseFloat(cs.borderLeftWidth) || 0) - (parseFloat(cs.borderRightWidth) || 0);
    if (!(inner > 0) || W <= 0) return this.scale || 1;
    const maxH = parseFloat(cs.maxHeight) || Infinity;
    const room = (s) => (H * s > maxH ? inner - 16 : inner);   // 16: the box's vertical scroll bar
    const f = this.fit;
    if (f && f.W === W && f.H === H && inner < f.inner + 24 && (W * f.s <= room(f.s) + 0.5 || f.s <= FIT_MIN)) return f.s;
    let s = Math.min(1, inner / W);
    if (H * s > maxH) s = Math.min(1, (inner - 16) / W);
    s = Math.max(FIT_MIN, Math.floor(s * 1000) / 1000);
    this.fit = { W, H, inner, s };
    return s;
  },

  /** First view of a graph (and "Fit"): its left end, vertically on the vertices seen there. */
  placeView(el) {
    const s = this.scale, cw = el.clientWidth, ch = el.clientHeight;
    let y0 = Infinity, y1 = -Infinity, x0 = Infinity;
    for (const p of this.layout.nodes.values()) x0 = Math.min(x0, p.x);
    for (const p of this.layout.nodes.values()) {
      if ((p.x - x0) * s < cw) { y0 = Math.min(y0, p.y); y1 = Math.max(y1, p.y + p.h); }
    }
    el.scrollLeft = 0;
    if (!isFinite(y0)) { el.scrollTop = 0; return; }
    el.scrollTop = (y1 - y0) * s <= ch ? ((y0 + y1) / 2) * s - ch / 2 : y0 * s - 12;
  },

  /** Zoom buttons: factor > 1 in, < 1 out, null back to fitting the width. */
  zoomBy(factor) {
    if (!this.layout) return;
    if (factor === null) { this.zoom = null; this.fit = null; this.viewPlaced = false; return this.renderDag(); }
    const cur = this.scale || 1;
    let next = cur * factor;
    if ((cur < 1 && next > 1) || (cur > 1 && next < 1)) next = 1;   // stop at 100% on the way
    this.zoom = Math.min(ZOOM_MAX, Math.max(ZOOM_MIN, Math.round(next * 1000) / 1000));
    this.renderDag();
  },

  renderPanel() {
    const slot = $('#vertex-slot');
    if (!slot) return;
    if (!this.vid) { setHTML(slot, ''); return; }
    const vid = this.vid;
    let panel = $('#vertex-panel');
    if (!panel || panel.dataset.vertexId !== vid) {
      setHTML(slot, `<section id="vertex-panel" data-vertex-id="${esc(vid)}" class="card">
        <div class="card-h" id="vp-head"></div><div id="vp-bp"></div>
        <div class="tbl-wrap"><table class="tbl attempts"><thead><tr>
          <th>Subtask</th><th>Attempt</th><th>Host / endpoint</th><th>State</th><th>Start time</th><th>Duration</th>
          <th class="num">Records in</th><th class="num">Records out</th><th class="num">Bytes in</th><th class="num">Bytes out</th>
          <th class="num" title="busy / back-pressured, ms per second">Busy / back-pr.</th><th>Failure cause</th></tr></thead>
          <tbody id="vp-rows"></tbody></table></div></section>`);
      panel = $('#vertex-panel');
    }
    const jv = ((this.job && this.job.vertices) || []).find((v) => v.id === vid);
    const close = `<a class="close" href="#/jobs/${esc(enc(this.jid))}" title="Close">×</a>`;
    if (this.vertexFor !== vid || !this.vertex) {
      setHTML($('#vp-head'), `<h2>${esc(jv ? jv.name : vid)}</h2><span class="grow"></span>${close}`);
      setHTML($('#vp-bp'), '');
      patchRows($('#vp-rows'), [{ key: 'loading', html: '<tr class="empty"><td colspan="12">Loading…</td></tr>' }]);
      return;
    }
    if (!this.vertex.ok) {
      setHTML($('#vp-head'), `<h2>${esc(jv ? jv.name : vid)}</h2><span class="grow"></span>${close}`);
      setHTML($('#vp-bp'), errBox(this.vertex.error));
      patchRows($('#vp-rows'), []);
      return;
    }
    const d = this.vertex.value;
    const par = isNum(d.parallelism) ? d.parallelism : jv?.parallelism;
    setHTML($('#vp-head'), `<h2 title="${esc(d.name)}">${esc(d.name)}</h2>${jv ? badge(jv.status) : ''}
      <span class="muted">Parallelism ${par === -1 ? 'decided at runtime' : esc(par ?? '–')} · max ${esc(known(d.maxParallelism))}</span>
      <span class="grow"></span>${close}`);
    setHTML($('#vp-bp'), this.bpHtml());
    const rows = [];
    for (const st of d.subtasks || []) {
      const attempts = Array.isArray(st.attempts) && st.attempts.length ? st.attempts : [st, ...(st['other-concurrent-attempts'] || [])];
      attempts.forEach((a, k) => rows.push(this.attemptRow(st, a, k === 0)));
    }
    patchRows($('#vp-rows'), rows.length ? rows : [{ key: 'none', html: '<tr class="empty"><td colspan="12">No subtasks yet (parallelism not decided or not scheduled).</td></tr>' }]);
  },

  attemptRow(st, a, first) {
    const m = a.metrics || {};
    const shown = a.attempt === st.attempt;
    const ep = a.endpoint || a.host || '–';
    const host = a.host ?? String(a.endpoint || '').replace(/:\d+$/, '');
    const cause = a['failure-cause'];
    const causeKey = `cause:${this.jid}:${this.vid}:${st.subtask}:${a.attempt}`;
    const tags = (shown ? '<span class="tag cur" title="The attempt the REST API shows for this subtask: the one that finished once one has, else the one closest to finishing">shown</span>' : '') +
      (a.speculative ? '<span class="tag spec" title="speculative attempt">speculative</span>' : '');
    const html = `<tr class="attempt" data-subtask="${esc(st.subtask)}" data-attempt="${esc(a.attempt)}" data-status="${esc(a.status)}" data-host="${esc(host)}"${shown ? ' data-current="true"' : ''}${a.speculative ? ' data-speculative="true"' : ''}${first ? ' data-first="true"' : ''}>
      <td class="num">${first ? esc(st.subtask) : `<span class="muted">${esc(st.subtask)}</span>`}</td>
      <td>#${esc(a.attempt)} ${tags}</td>
      <td><span class="mono">${esc(ep)}</span>${a['taskmanager-id'] && a['taskmanager-id'] !== '(unassigned)' ? `<div class="sub mono" title="TaskManager">${esc(a['taskmanager-id'])}</div>` : ''}</td>
      <td>${badge(a.status)}</td>
      <td title="${esc(fmtTime(a['start-time'] ?? a.start_time))}">${esc(fmtClock(a['start-time'] ?? a.start_time))}</td>
      <td>${TERMINAL.has(a.status) ? esc(fmtDuration(a.duration)) : liveDuration(a['start-time'] ?? a.start_time, a['end-time'], a.duration)}</td>
      <td class="num">${fmtCount(m['read-records'])}</td><td class="num">${fmtCount(m['write-records'])}</td>
      <td class="num">${esc(fmtBytes(m['read-bytes']))}</td><td class="num">${esc(fmtBytes(m['write-bytes']))}</td>
      <td class="num">${isNum(a['busy-ms-per-second']) ? Math.round(a['busy-ms-per-second']) : '–'} / ${esc(fmtMsPerSec(a['back-pressured-ms-per-second']))}</td>
      <td class="cause">${cause ? `<details data-open-key="${esc(causeKey)}"${S.openDetails.has(causeKey) ? ' open' : ''}><summary title="${esc(firstLine(cause))}">${esc(firstLine(cause))}</summary><pre>${esc(cause)}</pre></details>` : '<span class="muted">–</span>'}</td></tr>`;
    return { key: `${st.subtask}:${a.attempt}`, html };
  },

  bpHtml() {
    const r = this.bp;
    if (!r) return '';
    if (!r.ok) return `<div class="bp">${errBox(r.error)}</div>`;
    const b = r.value || {};
    const level = b['backpressure-level'] || b.backpressureLevel;
    if (b.status === 'deprecated' || !level) return '<div class="bp muted">Back pressure: no measurements yet.</div>';
    const chips = (b.subtasks || []).map((s) => {
      const l = s['backpressure-level'] || s.backpressureLevel || 'ok';
      const p = (x) => (isNum(x) ? Math.round(x * 100) + '%' : '–');
      return `<span class="bp-chip bp-${esc(l)}" title="subtask ${esc(s.subtask)}: back-pressured ${p(s.ratio)}, busy ${p(s.busyRatio)}, idle ${p(s.idleRatio)}">
        <b>#${esc(s.subtask)}</b> ${esc(l.toUpperCase())} <span>${p(s.ratio)}</span></span>`;
    }).join('');
    return `<div class="bp"><span class="bp-title">Back pressure</span><span class="bp-chip bp-${esc(level)} big">${esc(String(level).toUpperCase())}</span>
      <span class="muted">measured ${esc(fmtTime(b['end-timestamp']))}</span><div class="bp-subs">${chips}</div></div>`;
  },

  renderExceptions() {
    const el = $('#exceptions');
    const r = this.exc;
    if (!el || !r) return;
    if (!r.ok) return setHTML(el, `<div class="card-h"><h2>Exceptions</h2></div>${errBox(r.error)}`);
    const x = r.value || {};
    const hist = (x.exceptionHistory && x.exceptionHistory.entries) || [];
    const trace = (key, summary, text) => `<details data-open-key="${esc(key)}"${S.openDetails.has(key) ? ' open' : ''}>
      <summary>${esc(summary)}</summary><pre>${esc(text)}</pre></details>`;
    const entry = (e, i, prefix) => `<li class="exc">
      <div class="exc-meta"><b>${esc(e.exceptionName || firstLine(e.stacktrace))}</b>
        <span class="muted">${esc(fmtTime(e.timestamp))}</span>
        ${e.taskName ? `<span>task <span class="mono">${esc(e.taskName)}</span></span>` : '<span class="muted">global failure</span>'}
        ${e.endpoint ? `<span class="muted mono">${esc(e.endpoint)}</span>` : ''}
        ${Object.entries(e.failureLabels || {}).map(([k, v]) => `<span class="tag">${esc(k)}=${esc(v)}</span>`).join('')}</div>
      ${trace(`${prefix}${i}:${e.timestamp}`, 'Stack trace', e.stacktrace || '')}
      ${(e.concurrentExceptions || []).length ? `<div class="concurrent"><div class="muted">Concurrent exceptions (${e.concurrentExceptions.length})</div><ul>${e.concurrentExceptions.map((c, k) => entry(c, k, `${prefix}${i}.c`)).join('')}</ul></div>` : ''}</li>`;
    let body = '';
    if (x['root-exception']) {
      body += `<div class="exc-root"><div class="exc-meta"><b>Root exception</b><span class="muted">${esc(fmtTime(x.timestamp))}</span></div>
        ${trace('root:' + this.jid, firstLine(x['root-exception']), x['root-exception'])}</div>`;
    }
    if (hist.length) body += `<h3>History</h3><ul class="exc-list">${hist.map((e, i) => entry(e, i, 'h')).join('')}</ul>`;
    if (x.exceptionHistory && x.exceptionHistory.truncated) body += '<div class="muted">Older entries were truncated.</div>';
    if (!body) body = '<div class="muted pad">No exceptions.</div>';
    setHTML(el, `<div class="card-h"><h2>Exceptions</h2>${hist.length ? `<span class="count">${hist.length}</span>` : ''}</div>${body}`);
  },

  /** Checkpoints of a streaming job (Flink's Checkpoints tab): counts, the latest, the history. */
  renderCheckpoints() {
    const el = $('#checkpoints');
    const r = this.chk;
    if (!el) return;
    // A batch job takes no checkpoints: the API answers 404 and the card stays hidden.
    if (!r || !r.ok) { el.hidden = true; return; }
    el.hidden = false;
    const x = r.value || {};
    const c = x.counts || {};
    const latest = x.latest || {};
    const row = (k) => `<tr class="checkpoint" data-checkpoint-id="${esc(k.id)}" data-status="${esc(k.status)}">
      <td class="num">${esc(k.id)}</td><td><span class="state ${stCls(k.status === 'COMPLETED' ? 'FINISHED' : k.status === 'FAILED' ? 'FAILED' : 'RUNNING')}">${esc(k.status)}</span></td>
      <td>${esc(k.checkpoint_type || '')}</td><td>${esc(fmtTime(k.trigger_timestamp))}</td>
      <td class="num">${esc(fmtDuration(k.end_to_end_duration))}</td>
      <td class="num">${esc(fmtBytes(k.checkpointed_size))}</td><td class="num">${esc(fmtBytes(k.state_size))}</td>
      <td class="num">${esc(fmtBytes(k.processed_data))}</td><td class="num">${esc(fmtBytes(k.persisted_data))}</td>
      <td class="num">${esc(k.num_acknowledged_subtasks)}/${esc(k.num_subtasks)}</td></tr>`;
    const hist = (x.history || []).map(row).join('');
    const restored = latest.restored ? `<div class="muted">Restored checkpoint ${esc(latest.restored.id)}${latest.restored.is_savepoint ? ' (savepoint)' : ''} at ${esc(fmtTime(latest.restored.restore_timestamp))}${latest.restored.external_path ? ` from <span class="mono">${esc(latest.restored.external_path)}</span>` : ''}</div>` : '';
    const done = latest.completed ? `<div>Latest completed: <b>${esc(latest.completed.id)}</b>, ${esc(fmtDuration(latest.completed.end_to_end_duration))}, ${esc(fmtBytes(latest.completed.state_size))}${latest.completed.external_path ? ` at <span class="mono">${esc(latest.completed.external_path)}</span>` : ''}</div>` : '';
    const failed = latest.failed ? `<div class="muted">Latest failed: ${esc(latest.failed.id)} — ${esc(latest.failed.failure_message || '')}</div>` : '';
    setHTML(el, `<div class="card-h"><h2>Checkpoints</h2><span class="count">${fmtCount(c.completed)} completed</span></div>
      <div class="pad"><div>Triggered ${fmtCount(c.total)}, in progress ${fmtCount(c.in_progress)}, completed ${fmtCount(c.completed)}, failed ${fmtCount(c.failed)}, restored ${fmtCount(c.restored)}</div>
      ${done}${failed}${restored}</div>
      ${hist ? `<div class="tbl-wrap"><table class="tbl checkpoints"><thead><tr><th class="num">ID</th><th>Status</th><th>Type</th><th>Triggered</th><th class="num">End to end</th><th class="num">Checkpointed</th><th class="num">State size</th><th class="num">Processed (alignment)</th><th class="num">Persisted</th><th class="num">Acknowledged</th></tr></thead><tbody>${hist}</tbody></table></div>` : '<div class="muted pad">No checkpoint yet.</div>'}`);
  },

  renderConfig() {
    const el = $('#config');
    const r = this.cfg;
    if (!el || !r) return;
    if (!r.ok) return setHTML(el, `<div class="card-h"><h2>Configuration</h2></div>${errBox(r.error)}`);
    const ec = (r.value || {})['execution-config'];
    if (!ec) return setHTML(el, '<div class="card-h"><h2>Configuration</h2></div><div class="muted pad">No execution configuration archived.</div>');
    const kv = (obj) => Object.entries(obj).map(([k, v]) => `<tr><th>${esc(k)}</th><td class="mono">${esc(typeof v === 'object' ? JSON.stringify(v) : v)}</td></tr>`).join('');
    const { 'user-config': user, ...rest } = ec;
    setHTML(el, `<div class="card-h"><h2>Configuration</h2></div>
      <div class="cfg"><div><h3>Execution</h3><table class="kv">${kv(rest)}</table></div>
      <div><h3>User configuration</h3>${user && Object.keys(user).length ? `<table class="kv">${kv(user)}</table>` : '<div class="muted">None.</div>'}</div></div>`);
  },
};

async function cancelJob() {
  const jid = JobPage.jid, msg = $('#cancel-msg');
  const show = (text, cls) => { msg.hidden = false; msg.className = 'msg ' + cls; msg.textContent = text; };
  const headers = {};
  if (S.secretRequired) {
    const secret = window.prompt('This cluster requires its secret to cancel a job.\nSecret:');
    if (secret === null) return;
    headers['X-Fluvia-Secret'] = secret;
  } else if (!window.confirm(`Cancel job ${jid}?`)) return;
  show('Cancelling…', 'info');
  try {
    await api(`jobs/${enc(jid)}?mode=cancel`, { method: 'PATCH', headers });
    show('Cancellation requested.', 'ok');
    JobPage.frozen = false;
    tick();
  } catch (e) {
    show(`Cancel failed: ${e.message}`, 'err');
  }
}

/* ------------------------------------------------------------------ TaskManagers page */

/** Idle TaskManagers heartbeat every 10 s by default: only an age above 30 s is late. */
const HEARTBEAT_LATE_MS = 30000;

const TmPage = {
  details: new Map(),   // id -> {ok, value|error}
  jobNames: new Map(),

  mount(root) {
    root.innerHTML = `<section class="card"><div class="card-h"><h2>TaskManagers</h2><span class="muted">click a row for its tasks</span></div>
      <div class="tbl-wrap"><table class="tbl tms"><thead><tr>
        <th>ID</th><th>Path</th><th class="num">Data port</th><th>Slots (free / total)</th><th>Blocked</th><th class="num">Heartbeat age</th>
        <th class="num">Running tasks</th><th class="num">CPU cores</th><th>Memory</th>
      </tr></thead><tbody id="tm-rows"><tr class="empty"><td colspan="9">Loading…</td></tr></tbody></table></div></section>`;
  },

  async refresh(gen) {
    const req = { list: api('taskmanagers') };
    const ids = [...S.expandedTms];
    ids.forEach((id) => { req['d:' + id] = api(`taskmanagers/${enc(id)}`); });
    if (ids.length) req.jobs = api('jobs/overview');
    const res = await settle(req);
    if (gen !== S.gen) return;
    ids.forEach((id) => this.details.set(id, res['d:' + id]));
    if (res.jobs && res.jobs.ok) for (const j of res.jobs.value.jobs || []) this.jobNames.set(j.jid, j.name);
    if (!res.list.ok) {
      patchRows($('#tm-rows'), [{ key: 'err', html: `<tr class="empty"><td colspan="9">${errBox(res.list.error)}</td></tr>` }]);
      return setLoaded('taskmanagers');
    }
    this.render(res.list.value.taskmanagers || []);
    setLoaded('taskmanagers');
  },

  render(tms) {
    const rows = [];
    for (const t of tms) {
      const hw = t.hardware || {};
      const age = t['heartbeat-age-ms'];
      const open = S.expandedTms.has(t.id);
      const free = t.freeSlots, total = t.slotsNumber;
      rows.push({ key: 'tm:' + t.id, html: `<tr class="taskmanager" data-tm-id="${esc(t.id)}" data-blocked="${t.blocked ? 'true' : 'false'}"${open ? ' data-open="true"' : ''} tabindex="0">
        <td class="mono"><span class="caret">${open ? '▾' : '▸'}</span> ${esc(t.id)}</td><td class="mono">${esc(t.path)}</td><td class="num">${esc(known(t.dataPort))}</td>
        <td><span class="slots"><i style="width:${total > 0 && free >= 0 ? Math.round((100 * (total - free)) / total) : 0}%"></i></span> ${esc(known(free))} / ${esc(known(total))}</td>
        <td>${t.blocked ? '<span class="badge st-FAILED">BLOCKED</span>' : '<span class="muted">no</span>'}</td>
        <td class="num${isNum(age) && age > HEARTBEAT_LATE_MS ? ' warn-t' : ''}"${isNum(age) && age > HEARTBEAT_LATE_MS ? ' title="no heartbeat for more than 30 s"' : ''}>${isNum(age) ? esc(fmtDuration(age)) : '–'}</td>
        <td class="num">${esc(known(t['running-tasks']))}</td><td class="num">${esc(known(hw.cpuCores))}</td>
        <td>${[hw.physicalMemory, hw.freeMemory, hw.managedMemory].some((x) => isNum(x) && x >= 0)
          ? `<span title="physical memory">${esc(fmtBytes(hw.physicalMemory))}</span> <span class="sub">physical · ${esc(fmtBytes(hw.freeMemory))} free · ${esc(fmtBytes(hw.managedMemory))} managed</span>`
          : '<span class="muted" title="not reported">–</span>'}</td></tr>` });
      if (open) rows.push({ key: 'tmd:' + t.id, html: `<tr class="tm-detail"><td colspan="9">${this.detailHtml(t.id)}</td></tr>` });
    }
    patchRows($('#tm-rows'), rows.length ? rows : [{ key: 'none', html: '<tr class="empty"><td colspan="9">No TaskManagers registered.</td></tr>' }]);
  },

  detailHtml(id) {
    const r = this.details.get(id);
    if (!r) return '<div class="muted pad">Loading…</div>';
    if (!r.ok) return errBox(r.error);
    const d = r.value || {};
    const jobLink = (jid) => `<a href="#/jobs/${esc(enc(jid))}">${esc(this.jobNames.get(jid) || shortId(jid))}</a>`;
    const slots = (d.allocatedSlots || []).map((s) => jobLink(s.jobId)).join(', ') || '<span class="muted">none</span>';
    const tasks = (d.tasks || []).map((t) => `<tr><td>${jobLink(t.job_id)}</td><td>${esc(t.task)}</td><td class="num">${esc(t.subtask)}</td>
      <td class="num">${fmtCount(t.records_in)}</td><td class="num">${fmtCount(t.records_out)}</td>
      <td class="num">${esc(fmtBytes(t.bytes_in))}</td><td class="num">${esc(fmtBytes(t.bytes_out))}</td>
      <td class="num">${esc(fmtMsPerSec(t.busy_ms_per_second))}</td><td class="num">${esc(fmtMsPerSec(t.back_pressured_ms_per_second))}</td>
      <td class="num">${esc(fmtMsPerSec(t.idle_ms_per_second))}</td></tr>`).join('');
    return `<div class="tm-info"><span><b>Allocated slots:</b> ${slots}</span></div>
      ${tasks ? `<table class="tbl inner"><thead><tr><th>Job</th><th>Task</th><th class="num">Subtask</th><th class="num">Records in</th><th class="num">Records out</th>
        <th class="num">Bytes in</th><th class="num">Bytes out</th><th class="num">Busy</th><th class="num">Back-pressured</th><th class="num">Idle</th></tr></thead><tbody>${tasks}</tbody></table>`
        : '<div class="muted pad">No tasks running on this TaskManager.</div>'}`;
  },
};

/* ------------------------------------------------------------------ events and boot */

document.addEventListener('click', (ev) => {
  const t = ev.target;
  if (t.closest('a, button:not([data-action]), summary, details')) return;   // let links and disclosure work
  const action = t.closest('[data-action]');
  if (action && action.dataset.action === 'cancel') return void cancelJob();
  if (action && S.page === JobPage && action.dataset.action.startsWith('zoom-')) {
    return void JobPage.zoomBy({ 'zoom-in': ZOOM_STEP, 'zoom-out': 1 / ZOOM_STEP, 'zoom-fit': null }[action.dataset.action]);
  }
  const job = t.closest('tr.job');
  if (job) { location.hash = `#/jobs/${enc(job.dataset.jid)}`; return; }
  const vertex = t.closest('g.vertex');
  if (vertex && S.page === JobPage) {
    const vid = vertex.dataset.vertexId;
    location.hash = JobPage.vid === vid ? `#/jobs/${enc(JobPage.jid)}` : `#/jobs/${enc(JobPage.jid)}/vertices/${enc(vid)}`;
    setTimeout(() => { const p = $('#vertex-panel'); if (p) p.scrollIntoView({ block: 'nearest', behavior: 'smooth' }); }, 0);
    return;
  }
  const tm = t.closest('tr.taskmanager');
  if (tm) {
    const id = tm.dataset.tmId;
    if (S.expandedTms.has(id)) S.expandedTms.delete(id); else S.expandedTms.add(id);
    S.gen++;                                   // the in-flight answer does not know about this row
    tick();
  }
});
document.addEventListener('keydown', (ev) => {
  if ((ev.key === 'Enter' || ev.key === ' ') && ev.target.matches && ev.target.matches('tr.job, tr.taskmanager, g.vertex')) {
    ev.preventDefault();
    ev.target.dispatchEvent(new MouseEvent('click', { bubbles: true }));
  }
});
document.addEventListener('toggle', (ev) => {
  const k = ev.target.dataset && ev.target.dataset.openKey;
  if (k) { if (ev.target.open) S.openDetails.add(k); else S.openDetails.delete(k); }
}, true);
document.addEventListener('visibilitychange', () => { if (document.hidden) clearTimeout(S.timer); else tick(); });
window.addEventListener('hashchange', onRoute);
let resizeTimer = null;
window.addEventListener('resize', () => {              // a fitted graph follows the window's width
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => { if (S.page === JobPage && JobPage.zoom === null && JobPage.layout) { JobPage.fit = null; JobPage.renderDag(); } }, 150);
});
setInterval(() => {
  for (const el of document.querySelectorAll('.live[data-start]')) el.textContent = fmtDuration(serverNow() - Number(el.dataset.start));
}, 1000);

(async function boot() {
  try {
    const c = await api('config');
    if (isNum(c['refresh-interval']) && c['refresh-interval'] > 0) S.refresh = Math.max(200, c['refresh-interval']);
    S.secretRequired = c['secret-required'] === true;
    S.canCancel = !(c.features && c.features['web-cancel'] === false);
    if (c['flink-version']) $('#version').textContent = c['flink-version'];
  } catch (e) {
    console.warn('GET /config failed, using defaults', e);
  }
  onRoute();
})();
