"""The live dashboard served at `/`: current version, rounds, traffic and failures, costs.

One self-contained page (no network beyond this server) that polls `/v1/dashboard` every few
seconds and redraws its charts as inline SVG.
"""
from __future__ import annotations

PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>gymloop dashboard</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #1d2330; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; }
.card { border: 1px solid #dde2ea; border-radius: 6px; padding: 10px 14px; min-width: 150px; }
.card b { display: block; font-size: 22px; }
figure.chart { margin: 12px 0; padding: 8px; border: 1px solid #dde2ea; border-radius: 6px; }
figcaption { font-weight: 600; }
svg text { font-size: 11px; fill: #4a5366; }
.series { fill: none; stroke: #2f6fde; stroke-width: 2; } .bar { fill: #2f6fde; } .bad { fill: #d64545; }
table { border-collapse: collapse; } td, th { border: 1px solid #dde2ea; padding: 3px 8px; text-align: left; }
</style></head><body>
<h1>gymloop <span id="model"></span></h1>
<div class="cards">
  <div class="card">served version<b id="version">-</b></div>
  <div class="card">traces<b id="traces">-</b></div>
  <div class="card">served tokens<b id="tokens">-</b></div>
  <div class="card">feedback / failures<b id="failures">-</b></div>
  <div class="card">post-training spend<b id="spend">-</b></div>
  <div class="card">$ per 1M served tokens<b id="cpt">-</b></div>
</div>
<figure class="chart" id="scores-chart" data-chart="target score per round"><figcaption>Target score per round
 (dots: promoted)</figcaption><svg width="900" height="200" viewBox="0 0 900 200"></svg></figure>
<figure class="chart" id="traffic-chart" data-chart="requests by status"><figcaption>Requests by status</figcaption>
<svg width="900" height="120" viewBox="0 0 900 120"></svg></figure>
<h2>Model versions</h2><table id="versions"><thead><tr><th>version</th><th>status</th><th>parent</th><th>scores</th></tr></thead><tbody></tbody></table>
<p id="updated"></p>
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
function el(tag, attrs, text) { const e = document.createElementNS(NS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); if (text !== undefined) e.textContent = text; return e; }
function clear(svg) { while (svg.firstChild) svg.removeChild(svg.firstChild); }
function drawScores(rounds) {
  const svg = document.querySelector("#scores-chart svg"); clear(svg);
  const pts = rounds.map((r, i) => { const a = r.metrics.after || {}; const k = Object.keys(a)[0]; return [i, k ? a[k] : 0, r.status]; });
  if (!pts.length) { svg.appendChild(el("text", {x: 20, y: 100}, "no rounds yet")); return; }
  const x = i => 40 + i * (820 / Math.max(1, pts.length - 1)), y = v => 180 - v * 160;
  svg.appendChild(el("line", {x1: 40, x2: 860, y1: y(0), y2: y(0), stroke: "#dde2ea"}));
  svg.appendChild(el("text", {x: 4, y: y(1) + 4}, "1.0")); svg.appendChild(el("text", {x: 4, y: y(0) + 4}, "0.0"));
  svg.appendChild(el("polyline", {class: "series", points: pts.map(p => x(p[0]) + "," + y(p[1])).join(" ")}));
  for (const p of pts) if (p[2] === "promoted") svg.appendChild(el("circle", {cx: x(p[0]), cy: y(p[1]), r: 4, class: "bar"}));
}
function drawTraffic(requests) {
  const svg = document.querySelector("#traffic-chart svg"); clear(svg);
  const entries = Object.entries(requests); const max = Math.max(1, ...entries.map(e => e[1]));
  if (!entries.length) { svg.appendChild(el("text", {x: 20, y: 60}, "no requests yet")); return; }
  entries.forEach(([status, n], i) => {
    svg.appendChild(el("text", {x: 4, y: 20 + i * 24}, status));
    svg.appendChild(el("rect", {x: 50, y: 8 + i * 24, width: Math.max(1, n / max * 760), height: 16, class: status === "200" ? "bar" : "bad"}));
    svg.appendChild(el("text", {x: 56 + n / max * 760, y: 20 + i * 24}, String(n)));
  });
}
async function refresh() {
  const r = await fetch("/v1/dashboard"); if (!r.ok) throw new Error("dashboard data: HTTP " + r.status);
  const d = await r.json();
  document.getElementById("model").textContent = d.model;
  document.getElementById("version").textContent = "v" + d.version;
  document.getElementById("traces").textContent = d.stats.traces;
  document.getElementById("tokens").textContent = d.stats.served_tokens;
  document.getElementById("failures").textContent = d.stats.feedback + " / " + d.stats.failures;
  document.getElementById("spend").textContent = "$" + d.post_training_dollars.toFixed(4);
  const cpt = d.stats.cost_per_1m_served_tokens;
  document.getElementById("cpt").textContent = cpt === null ? "n/a" : "$" + cpt.toPrecision(3);
  drawScores(d.rounds); drawTraffic(d.requests);
  const body = document.querySelector("#versions tbody"); body.innerHTML = "";
  for (const v of d.versions) { const tr = document.createElement("tr");
    for (const c of [v.version, v.status, v.parent ?? "", JSON.stringify(v.scores)]) { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); }
    body.appendChild(tr); }
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  document.body.dataset.ready = "1";
}
refresh(); setInterval(refresh, 3000);
</script></body></html>"""


def dashboard_data(store, batcher, requests: dict[str, int], model_name: str) -> dict:
    rounds = store.versions.recent_rounds(50)
    spend = sum(((r["metrics"].get("economics") or {}).get("post_training_dollars") or 0.0) for r in rounds)
    return {"model": model_name, "version": batcher.version, "stats": store.ledger.stats(),
            "requests": requests, "rounds": rounds, "versions": store.versions.list()[-20:],
            "post_training_dollars": spend}
