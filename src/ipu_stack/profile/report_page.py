# ruff: noqa: E501  (the page's inline JavaScript keeps its own line lengths)
"""The HTML page of ``profile-render``: inline CSS and canvas code, data put in at
``/*DATA*/null`` (see :mod:`ipu_stack.profile.render`). Nothing is fetched when it opens."""

PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>ipu-stack profile</title>
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fff}
header{height:56px;padding:8px 16px;box-sizing:border-box;background:#223;color:#eee}
header h1{font-size:16px;margin:0}header p{margin:2px 0 0;font-size:12px;color:#bbc}
section{padding:8px 16px}h2{font-size:14px;margin:12px 0 6px}
#timeline{display:block;width:100%;height:560px;border:1px solid #ccc;cursor:crosshair}
.bar button,.bar select{font-size:12px;margin-right:6px}
#legend span{display:inline-block;margin-right:12px}
#legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}
#tip{position:fixed;pointer-events:none;background:#ffd;border:1px solid #aa8;padding:4px 6px;
 font-size:12px;display:none;white-space:pre;z-index:9}
table{border-collapse:collapse;font-size:12px;margin-bottom:8px}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}th{background:#f4f4f8}
td:first-child,th:first-child{text-align:left;max-width:420px;overflow:hidden}
.cols{display:flex;gap:24px;flex-wrap:wrap}
canvas.small{border:1px solid #ccc}
#errors{color:#b00;font-weight:bold}
</style></head>
<body data-status="loading" data-errors="0">
<header><h1 id="title">ipu-stack profile</h1><p id="subtitle"></p></header>
<section id="timeline-section">
<div class="bar"><button id="reset">reset zoom</button><button id="zin">zoom in</button>
<button id="zout">zoom out</button> colour by <select id="colour">
<option value="kind">kind</option><option value="kernel">kernel</option>
<option value="operation">operation</option></select>
<span>wheel: zoom time, shift+wheel: zoom tiles, drag: pan, double-click: reset</span></div>
<canvas id="timeline"></canvas>
<div id="legend"></div><div id="errors"></div>
</section>
<section id="phases-section"><h2>Exchange phases: scheduled horizon against lower bound</h2>
<canvas id="phases" class="small" width="900" height="220"></canvas>
<div id="barriers"></div></section>
<section id="memory"><h2>Tile memory at each tile's peak step</h2>
<div class="cols" id="heat"></div></section>
<section id="tables" class="cols"><div><h2>By operation</h2><div id="t_operation"></div></div>
<div><h2>By kernel</h2><div id="t_kernel"></div></div>
<div><h2>By kind</h2><div id="t_kind"></div></div></section>
<div id="tip"></div>
<script>
"use strict";
const DATA = /*DATA*/null;
const KINDS = ["compute", "exchange", "sync", "idle"];
const KIND_COLOURS = ["#3b6fb6", "#e8812a", "#8c8c8c", "#f2f2f2"];
const PALETTE = ["#3b6fb6","#e8812a","#4aa05a","#c8453c","#8c62b8","#8c564b","#d77cbd",
  "#7f7f7f","#b5b82e","#2fb5c7","#1f4f8f","#f5b041"];
let errors = 0;
function fail(msg) {
  errors += 1; document.body.dataset.errors = String(errors);
  document.getElementById("errors").textContent += msg + " ";
}
window.addEventListener("error", e => fail(String(e.message)));
window.addEventListener("unhandledrejection", e => fail(String(e.reason)));
const fmt = n => Number(n).toLocaleString("en-US");
async function column(b64) {
  const bin = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const stream = new Blob([bin]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Int32Array(await new Response(stream).arrayBuffer());
}
function table(el, rows) {
  const head = ["name","count","phase_cycles","work_cycles","mean","p50","p95","max"];
  let h = "<table><tr>" + head.map(x => "<th>" + x + "</th>").join("") + "</tr>";
  for (const r of rows) {
    h += "<tr>" + head.map(k => "<td>" + (k === "name" ? esc(r[k]) :
      fmt(k === "mean" ? r[k].toFixed(1) : r[k])) + "</td>").join("") + "</tr>";
  }
  document.getElementById(el).innerHTML = h + "</table>";
}
function esc(s) { return String(s).replace(/[&<>]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;"})[c]); }

async function main() {
  const only = location.hash.slice(1);  // e.g. #memory: show that section alone
  if (only) for (const s of document.querySelectorAll("section")) if (s.id !== only) s.style.display = "none";
  const m = DATA.meta, n = DATA.count, tiles = m.tiles.length;
  const us = c => (c / m.clock_hz * 1e6).toFixed(3) + " us";
  document.getElementById("subtitle").textContent =
    `${fmt(tiles)} tiles, ${fmt(m.cycles)} simulated cycles = ${us(m.cycles)} at ` +
    `${m.clock_hz / 1e9} GHz, ${fmt(n)} segments, package ${(m.package.digest || "").slice(0, 16)}`;
  const S = {};
  for (const k of Object.keys(DATA.segments)) S[k] = await column(DATA.segments[k]);
  // first segment of each tile (segments are sorted by tile, then start)
  const first = new Int32Array(tiles + 1).fill(n);
  for (let i = n - 1; i >= 0; i--) first[S.tile[i]] = i;
  for (let t = tiles - 1; t >= 0; t--) if (first[t] > first[t + 1]) first[t] = first[t + 1];
  const cv = document.getElementById("timeline"), ctx = cv.getContext("2d");
  const LEFT = 70, TOP = 22;
  let x0 = 0, x1 = m.cycles, y0 = 0, y1 = tiles;
  const colourOf = () => {
    const by = document.getElementById("colour").value;
    return i => {
      if (by === "kind" || S.kind[i] !== 0) return KIND_COLOURS[S.kind[i]];
      return PALETTE[(by === "kernel" ? S.kernel[i] : S.operation[i]) % PALETTE.length];
    };
  };
  function draw() {
    const dpr = window.devicePixelRatio || 1, W = cv.clientWidth, H = cv.clientHeight;
    cv.width = W * dpr; cv.height = H * dpr; ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    const pw = W - LEFT - 8, ph = H - TOP - 4;
    const sx = pw / (x1 - x0), sy = ph / (y1 - y0), colour = colourOf();
    ctx.fillStyle = KIND_COLOURS[3]; ctx.fillRect(LEFT, TOP, pw, ph);
    const t0 = Math.max(0, Math.floor(y0)), t1 = Math.min(tiles, Math.ceil(y1));
    for (let t = t0; t < t1; t++) {
      const y = TOP + (t - y0) * sy, h = Math.max(sy, 1);
      for (let i = first[t]; i < first[t + 1]; i++) {
        const a = S.start[i], b = S.end[i];
        if (b < x0 || a > x1 || S.kind[i] === 3) continue;
        const xa = LEFT + Math.max(0, (a - x0) * sx), xb = LEFT + Math.min(pw, (b - x0) * sx);
        ctx.fillStyle = colour(i); ctx.fillRect(xa, y, Math.max(xb - xa, 0.7), h);
      }
    }
    ctx.strokeStyle = "rgba(0,0,0,0.25)"; ctx.beginPath();
    for (const e of DATA.executions) {
      const x = LEFT + (e.start - x0) * sx;
      if (x >= LEFT && x <= LEFT + pw) { ctx.moveTo(x, TOP); ctx.lineTo(x, TOP + ph); }
    }
    ctx.stroke();
    ctx.fillStyle = "#222"; ctx.font = "11px sans-serif"; ctx.textAlign = "center";
    const step = niceStep((x1 - x0) / 8);
    for (let c = Math.ceil(x0 / step) * step; c <= x1; c += step) {
      ctx.fillText(fmt(c), LEFT + (c - x0) * sx, 14);
    }
    ctx.textAlign = "right";
    const tstep = Math.max(1, niceStep((y1 - y0) / 12));
    for (let t = Math.ceil(y0 / tstep) * tstep; t < y1; t += tstep) {
      ctx.fillText("tile " + m.tiles[t], LEFT - 4, TOP + (t - y0 + 0.5) * sy + 4);
    }
    document.body.dataset.status = "drawn";
  }
  function niceStep(x) {
    const p = Math.pow(10, Math.floor(Math.log10(Math.max(x, 1e-9)))), r = x / p;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * p;
  }
  function zoom(f, cx, cy, tilesAxis) {
    const W = cv.clientWidth - LEFT - 8, H = cv.clientHeight - TOP - 4;
    if (tilesAxis) {
      const c = y0 + (cy - TOP) / H * (y1 - y0), span = Math.min(tiles, Math.max(4, (y1 - y0) * f));
      y0 = Math.max(0, c - (c - y0) * span / (y1 - y0)); y1 = Math.min(tiles, y0 + span);
    } else {
      const c = x0 + (cx - LEFT) / W * (x1 - x0), span = Math.min(m.cycles, Math.max(20, (x1 - x0) * f));
      x0 = Math.max(0, c - (c - x0) * span / (x1 - x0)); x1 = Math.min(m.cycles, x0 + span);
    }
    draw();
  }
  cv.addEventListener("wheel", e => {
    e.preventDefault(); const r = cv.getBoundingClientRect();
    zoom(e.deltaY > 0 ? 1.25 : 0.8, e.clientX - r.left, e.clientY - r.top, e.shiftKey);
  }, {passive: false});
  let drag = null;
  cv.addEventListener("mousedown", e => { drag = {x: e.clientX, y: e.clientY, x0, x1, y0, y1}; });
  window.addEventListener("mouseup", () => { drag = null; });
  const tip = document.getElementById("tip");
  cv.addEventListener("mousemove", e => {
    const r = cv.getBoundingClientRect(), W = cv.clientWidth - LEFT - 8, H = cv.clientHeight - TOP - 4;
    if (drag) {
      const dx = (e.clientX - drag.x) / W * (drag.x1 - drag.x0), dy = (e.clientY - drag.y) / H * (drag.y1 - drag.y0);
      x0 = Math.max(0, Math.min(m.cycles - (drag.x1 - drag.x0), drag.x0 - dx)); x1 = x0 + (drag.x1 - drag.x0);
      y0 = Math.max(0, Math.min(tiles - (drag.y1 - drag.y0), drag.y0 - dy)); y1 = y0 + (drag.y1 - drag.y0);
      draw(); return;
    }
    const c = x0 + (e.clientX - r.left - LEFT) / W * (x1 - x0), t = Math.floor(y0 + (e.clientY - r.top - TOP) / H * (y1 - y0));
    if (t < 0 || t >= tiles || c < 0 || c > m.cycles) { tip.style.display = "none"; return; }
    for (let i = first[t]; i < first[t + 1]; i++) {
      if (S.start[i] <= c && c < S.end[i]) {
        tip.textContent = `tile ${m.tiles[t]} (logical ${t})\n${KINDS[S.kind[i]]}: ` +
          `${m.kernels[S.kernel[i]]}\noperation ${m.operations[S.operation[i]]}\n` +
          `cycles ${fmt(S.start[i])}..${fmt(S.end[i])} (${fmt(S.end[i] - S.start[i])})`;
        tip.style.left = (e.clientX + 14) + "px"; tip.style.top = (e.clientY + 10) + "px";
        tip.style.display = "block"; return;
      }
    }
    tip.style.display = "none";
  });
  cv.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  const reset = () => { x0 = 0; x1 = m.cycles; y0 = 0; y1 = tiles; draw(); };
  cv.addEventListener("dblclick", reset);
  document.getElementById("reset").onclick = reset;
  document.getElementById("zin").onclick = () => zoom(0.5, LEFT + (cv.clientWidth - LEFT) / 2, 0, false);
  document.getElementById("zout").onclick = () => zoom(2, LEFT + (cv.clientWidth - LEFT) / 2, 0, false);
  document.getElementById("colour").onchange = () => { legend(); draw(); };
  function legend() {
    const by = document.getElementById("colour").value;
    let items = KINDS.map((k, i) => [k, KIND_COLOURS[i]]);
    if (by !== "kind") {
      const names = by === "kernel" ? m.kernels : m.operations;
      items = names.map((k, i) => [k, PALETTE[i % PALETTE.length]])
        .filter(([k]) => !["exchange", "sync", "idle"].includes(k)).concat(items.slice(1));
    }
    document.getElementById("legend").innerHTML =
      items.map(([k, c]) => `<span><i style="background:${c}"></i>${esc(k)}</span>`).join("");
  }
  window.addEventListener("resize", draw);
  legend(); draw(); phases(); heat(); barrierTable();
  for (const g of ["operation", "kernel", "kind"]) table("t_" + g, DATA.tables[g]);
  if (!errors) document.body.dataset.status = "ready";
}

function phases() {
  const cv = document.getElementById("phases"), ctx = cv.getContext("2d"), B = DATA.barriers;
  const W = cv.width, H = cv.height, L = 60, bot = 36;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
  if (!B.length) { ctx.fillStyle = "#222"; ctx.fillText("no exchange phases", L, 40); return; }
  const top = Math.max(...B.map(b => Math.max(b.horizon, b.lower_bound))) * 1.1;
  const bw = (W - L - 10) / B.length;
  ctx.font = "11px sans-serif";
  B.forEach((b, i) => {
    const x = L + i * bw, h = (H - bot - 10) * b.horizon / top, lb = (H - bot - 10) * b.lower_bound / top;
    ctx.fillStyle = "#e8812a"; ctx.fillRect(x + bw * 0.15, H - bot - h, bw * 0.7, h);
    ctx.strokeStyle = "#000"; ctx.lineWidth = 2; ctx.beginPath();
    ctx.moveTo(x + bw * 0.05, H - bot - lb); ctx.lineTo(x + bw * 0.95, H - bot - lb); ctx.stroke();
    ctx.fillStyle = "#222"; ctx.textAlign = "center";
    ctx.fillText("phase " + b.phase, x + bw / 2, H - bot + 14);
    ctx.fillText(b.ratio === null ? "-" : b.ratio.toFixed(3), x + bw / 2, H - bot + 28);
  });
  ctx.textAlign = "left";
  ctx.fillText("bars: scheduled horizon (cycles); black line: lower bound; below: ratio", L, 12);
  ctx.textAlign = "right"; ctx.fillText(Math.round(top / 1.1).toLocaleString("en-US"), L - 4, 24);
}

function barrierTable() {
  const head = ["phase","name","first_arrival","last_arrival","late_tile","spread","horizon","lower_bound","bound"];
  let h = "<table><tr>" + head.map(x => "<th>" + x + "</th>").join("") + "</tr>";
  for (const b of DATA.barriers) h += "<tr>" + head.map(k => "<td>" + esc(typeof b[k] === "number" ? fmt(b[k]) : b[k]) + "</td>").join("") + "</tr>";
  document.getElementById("barriers").innerHTML = h + "</table>";
}

function heat() {
  const M = DATA.memory, tiles = DATA.meta.tiles, n = tiles.length;
  const cols = Math.ceil(Math.sqrt(n * 2)), rows = Math.ceil(n / cols), cell = Math.max(6, Math.min(14, Math.floor(560 / cols)));
  const box = document.getElementById("heat"), tip = document.getElementById("tip");
  ["standard", "interleaved"].forEach((region, r) => {
    const div = document.createElement("div"), cap = M.capacity[r];
    const v0 = M[region], top = v0.reduce((a, b, i) => (b > v0[a] ? i : a), 0);
    const mean = v0.reduce((a, b) => a + b, 0) / n;
    div.innerHTML = `<b>${region}</b> region (${fmt(cap)} bytes per tile): most ` +
      `${fmt(v0[top])} B (tile ${tiles[top]}), mean ${fmt(Math.round(mean))} B<br>`;
    const cv = document.createElement("canvas"); cv.className = "small";
    cv.width = cols * cell; cv.height = rows * cell; div.appendChild(cv); box.appendChild(div);
    const ctx = cv.getContext("2d"), v = M[region];
    for (let t = 0; t < n; t++) {
      const f = Math.min(1, v[t] / cap);
      ctx.fillStyle = f === 0 ? "#f4f4f4" : `hsl(${Math.round(220 - 220 * f)},75%,${Math.round(70 - 25 * f)}%)`;
      ctx.fillRect((t % cols) * cell, Math.floor(t / cols) * cell, cell - 1, cell - 1);
    }
    cv.addEventListener("mousemove", e => {
      const rc = cv.getBoundingClientRect(), t = Math.floor((e.clientY - rc.top) / cell) * cols + Math.floor((e.clientX - rc.left) / cell);
      if (t < 0 || t >= n) { tip.style.display = "none"; return; }
      tip.textContent = `tile ${tiles[t]} (logical ${t}), peak at step ${M.peak_step[t]}\nstandard ${fmt(M.standard[t])} bytes\ninterleaved ${fmt(M.interleaved[t])} bytes`;
      tip.style.left = (e.clientX + 14) + "px"; tip.style.top = (e.clientY + 10) + "px"; tip.style.display = "block";
    });
    cv.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  });
  const scale = document.createElement("div");
  const stops = [0, 0.25, 0.5, 0.75, 1].map(f => `hsl(${Math.round(220 - 220 * f)},75%,${Math.round(70 - 25 * f)}%)`);
  scale.innerHTML = `share of the region in use: 0% <span style="display:inline-block;width:160px;height:10px;background:linear-gradient(90deg,${stops.join(",")})"></span> 100%; grey: nothing; tiles in logical order, row by row`;
  box.appendChild(scale);
}
main().catch(e => fail("report: " + e));
</script></body></html>
"""
