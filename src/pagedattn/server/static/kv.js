// The live KV-cache page: polls /v1/kv/state (one request at a time, paused while the tab is
// hidden) and draws the page pool, the running page tables and the last minutes' rates.
import { api, AuthError, boot, el, errorMessage, formatBytes } from "./common.js";

const POLL_MS = 1000;
const QUERY = "max_cells=4096&max_requests=64&max_pages_per_request=256";
const STATES = { f: "free", c: "cached", u: "used", s: "shared" };
const LABELS = { f: "Free", c: "Cached prefix (LRU)", u: "In use", s: "Shared" };
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

let paused = false;
let timer = 0;
const grids = new Map(); // group id -> { box, cells: [] }

// ---- cards ------------------------------------------------------------------------------

function card(label, value, detail, cls) {
  const node = el("div", `stat-card ${cls || ""}`);
  node.append(el("div", "label", label), el("div", "value", value));
  if (detail) node.appendChild(el("div", "detail", detail));
  return node;
}

function renderCards(state) {
  const c = state.counters;
  const g = state.groups[0];
  const pct = (n) => `${((100 * n) / Math.max(1, c.num_pages)).toFixed(1)}%`;
  const ratio = c.prefix_cache_hit_ratio;
  const evictions = Object.values(c.evictions).reduce((a, b) => a + b, 0);
  const byReason = Object.entries(c.evictions).filter(([, n]) => n > 0).map(([r, n]) => `${r} ${n}`).join(" · ");
  $("cards").replaceChildren(
    card("Pages in use", `${c.num_used_pages} / ${c.num_pages}`, `${pct(c.num_used_pages)} · ${g.counts.shared} shared`, "accent-u"),
    card("Cached prefixes", String(g.counts.cached), `in the LRU, reusable · ${g.num_registered} pages hashed`, "accent-c"),
    card("Free pages", String(g.counts.free), `${c.num_free_pages} allocatable with cached`, "accent-f"),
    card("Prefix-cache hit ratio", ratio == null ? "–" : `${(100 * ratio).toFixed(1)}%`,
      `${c.prefix_cache_hits} of ${c.prefix_cache_queries} prompt tokens`, "accent-s"),
    card("Evictions", String(evictions), byReason || "none yet"),
    card("Preemptions", String(c.num_preemptions), "sequences recomputed for lack of pages"),
    card("Requests", `${c.num_running} running`, `${c.num_waiting} waiting`),
  );
}

// ---- page grid --------------------------------------------------------------------------

function renderLegend(group) {
  $("legend").replaceChildren(...Object.keys(STATES).map((k) => {
    const item = el("span", "legend-item");
    item.append(el("i", `swatch ${k}`), el("span", "", `${LABELS[k]} `), el("b", `count-${STATES[k]}`, String(group.counts[STATES[k]])));
    return item;
  }));
}

function renderGroup(group) {
  let grid = grids.get(group.id);
  if (!grid) {
    const section = el("div", "group");
    const title = section.appendChild(el("div", "group-title"));
    const box = section.appendChild(el("div", "grid"));
    box.dataset.group = String(group.id);
    $("groups").appendChild(section);
    grid = { section, title, box, cells: [] };
    grids.set(group.id, grid);
  }
  const layers = group.num_layers === 1 ? `layer ${group.first_layer}` : `layers ${group.first_layer}–${group.first_layer + group.num_layers - 1}`;
  const per = group.pages_per_cell === 1 ? "one cell per page" : `one cell per ${group.pages_per_cell} pages (most common state)`;
  grid.title.textContent = `Group ${group.id} · ${layers} · ${group.kv_dtype} · ${group.page_size} tokens/page · ${formatBytes(group.bytes_per_page)}/page · ${group.num_pages} pages · ${per}`;
  if (grid.cells.length !== group.num_cells) {
    grid.box.replaceChildren();
    grid.cells = [];
    for (let i = 0; i < group.num_cells; i += 1) grid.cells.push(grid.box.appendChild(el("i", "cell")));
    grid.box.className = `grid ${group.num_cells <= 512 ? "large" : group.num_cells <= 2048 ? "medium" : "small"}`;
  }
  let i = 0;
  for (const [letter, run] of group.cells) {
    for (let k = 0; k < run; k += 1, i += 1) {
      const cell = grid.cells[i];
      const cls = `cell ${letter}`;
      if (cell.className !== cls) {
        cell.className = cls;
        const first = i * group.pages_per_cell;
        const where = group.pages_per_cell === 1 ? `page ${first}` : `pages ${first}–${Math.min(group.num_pages, first + group.pages_per_cell) - 1}`;
        cell.title = `${where}: ${LABELS[letter].toLowerCase()}`;
      }
    }
  }
}

// ---- page tables ------------------------------------------------------------------------

function renderRequests(state) {
  const box = $("requests");
  const total = state.requests.length + state.requests_truncated;
  $("request-count").textContent = `(${total})`;
  if (total === 0) {
    box.replaceChildren(el("p", "empty-note", "No request is running. Send one from the chat page and watch its pages appear."));
    return;
  }
  const rows = state.requests.map((r) => {
    const row = el("div", "req-row");
    row.dataset.requestId = r.request_id;
    const head = row.appendChild(el("div", "req-head"));
    const id = head.appendChild(el("span", "req-id", r.request_id));
    id.title = `request ${r.request_id} · sequence ${r.seq_id}`;
    head.append(
      el("span", "req-meta", `${r.num_computed_tokens}/${r.num_tokens} tokens`),
      el("span", "req-meta", `${r.num_cached_tokens} cached`),
    );
    for (const table of r.tables) {
      head.appendChild(el("span", "req-meta", `${table.num_pages} pages`));
      const strip = row.appendChild(el("div", "strip"));
      table.pages.forEach((page, k) => {
        const letter = table.states[k];
        const cell = strip.appendChild(el("i", letter === "-" ? "pg dropped" : `pg ${letter}`));
        cell.title = page < 0 ? `position ${k}: dropped` : `position ${k}: page ${page} (${STATES[letter]})`;
      });
      if (table.truncated > 0) strip.appendChild(el("span", "more", `+${table.truncated}`));
    }
    return row;
  });
  if (state.requests_truncated > 0) rows.push(el("p", "muted", `+${state.requests_truncated} more running sequences not listed`));
  box.replaceChildren(...rows);
}

// ---- charts -----------------------------------------------------------------------------

function sparkline(values) {
  const w = 240;
  const h = 56;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.classList.add("spark");
  const finite = values.filter((v) => v != null);
  if (finite.length < 2) return svg;
  const max = Math.max(...finite, 1e-9);
  const pts = values.map((v, i) => [(i / (values.length - 1)) * w, v == null ? null : h - 4 - (v / max) * (h - 8)]);
  let d = "";
  for (const [x, y] of pts) if (y != null) d += `${d ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
  const area = document.createElementNS(SVG, "path");
  const firstX = pts.find((p) => p[1] != null)[0];
  const lastX = [...pts].reverse().find((p) => p[1] != null)[0];
  area.setAttribute("d", `${d}L${lastX.toFixed(1)},${h}L${firstX.toFixed(1)},${h}Z`);
  area.classList.add("area");
  const line = document.createElementNS(SVG, "path");
  line.setAttribute("d", d);
  line.classList.add("line");
  svg.append(area, line);
  return svg;
}

function renderCharts(state) {
  const h = state.history;
  const tier = state.counters.tier;
  const last = (key) => {
    for (let i = h.length - 1; i >= 0; i -= 1) if (h[i][key] != null) return h[i][key];
    return null;
  };
  const fmt = (v, unit, digits = 2) => (v == null ? "–" : `${v.toFixed(digits)}${unit}`);
  const charts = [
    ["Pages in use", h.map((p) => p.used_pages), fmt(last("used_pages"), "", 0)],
    ["Prefix hit ratio", h.map((p) => p.prefix_cache_hit_ratio), last("prefix_cache_hit_ratio") == null ? "–" : `${(100 * last("prefix_cache_hit_ratio")).toFixed(0)}%`],
    ["Evictions /s", h.map((p) => p.evictions_per_s), fmt(last("evictions_per_s"), "")],
    ["Preemptions /s", h.map((p) => p.preemptions_per_s), fmt(last("preemptions_per_s"), "")],
    ["Tier reads /s", h.map((p) => p.tier_pages_read_per_s), tier ? `${fmt(last("tier_pages_read_per_s"), " pages")} · ${formatBytes(last("tier_bytes_read_per_s") ?? 0)}/s` : "no tier"],
    ["Tier writes /s", h.map((p) => p.tier_pages_written_per_s), tier ? `${fmt(last("tier_pages_written_per_s"), " pages")} · ${formatBytes(last("tier_bytes_written_per_s") ?? 0)}/s` : "no tier"],
  ];
  $("charts").replaceChildren(...charts.map(([title, values, now]) => {
    const box = el("div", "chart");
    const head = box.appendChild(el("div", "chart-head"));
    head.append(el("span", "", title), el("b", "", now));
    box.appendChild(sparkline(values));
    return box;
  }));
  const minutes = h.length ? (h[h.length - 1].time - h[0].time + h[0].interval_s) / 60 : 0;
  $("history-note").textContent = `${minutes.toFixed(1)} min, a point every ${state.history_interval_s} s${tier ? ` · tier: ${tier.backend}` : " · no KV tier (--kv-store)"}`;
}

// ---- polling ----------------------------------------------------------------------------

function render(state) {
  renderCards(state);
  renderLegend(state.groups[0]);
  for (const group of state.groups) renderGroup(group);
  renderRequests(state);
  renderCharts(state);
  $("status").textContent = `${state.model} · updated ${new Date(state.created * 1000).toLocaleTimeString()}`;
}

async function fetchState() {
  const res = await api(`/v1/kv/state?${QUERY}`);
  if (!res.ok) throw new Error(await errorMessage(res));
  return res.json();
}

async function poll() {
  timer = 0;
  if (paused || document.hidden) return;
  try {
    render(await fetchState());
  } catch (err) {
    if (err instanceof AuthError) { window.location.reload(); return; }
    $("status").textContent = `not updated: ${err.message}`;
  }
  if (!paused && !document.hidden && !timer) timer = setTimeout(poll, POLL_MS);
}

let started = false;
async function start() {
  try {
    render(await fetchState());
  } catch (err) {
    if (err instanceof AuthError) throw err; // the login prompt shows instead of the page
    $("status").textContent = `not updated: ${err.message}`;
  }
  if (started) return;
  started = true;
  timer = setTimeout(poll, POLL_MS);
  $("pause").addEventListener("click", () => {
    paused = !paused;
    $("pause").textContent = paused ? "Resume" : "Pause";
    if (!paused && !timer) poll();
  });
  window.addEventListener("pagehide", () => { clearTimeout(timer); timer = 0; paused = true; });
  window.addEventListener("pageshow", (e) => {
    if (e.persisted) { paused = false; $("pause").textContent = "Pause"; poll(); }
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && !paused && !timer) poll();
  });
}

boot(start);
