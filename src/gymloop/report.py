"""`gymloop report RUN_DIR`: a self-contained report.html (inline SVG, no network) of a run.

Charts: held-out pass@1 per evaluation, training reward and loss per step, cost by phase;
tables: before/after, economics (cost per 1M tokens, intelligence per dollar, projections).
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Sequence

W, H, PAD = 560, 220, 40


def _line_chart(title: str, xs: Sequence[float], ys: Sequence[float], ylabel: str,
                ymin: float | None = None, ymax: float | None = None) -> str:
    if not xs:
        return f'<figure class="chart" data-chart="{html.escape(title)}"><figcaption>{html.escape(title)}: no data</figcaption></figure>'
    lo = min(ys) if ymin is None else ymin
    hi = max(ys) if ymax is None else ymax
    hi = hi if hi > lo else lo + 1
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    sx = lambda x: PAD + (x - x0) / (x1 - x0) * (W - 2 * PAD)  # noqa: E731
    sy = lambda y: H - PAD - (y - lo) / (hi - lo) * (H - 2 * PAD)  # noqa: E731
    pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys))
    ticks = "".join(
        f'<text x="{PAD - 4}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:.2g}</text>'
        f'<line x1="{PAD}" x2="{W - PAD}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" class="grid"/>'
        for v in (lo, (lo + hi) / 2, hi))
    return (f'<figure class="chart" data-chart="{html.escape(title)}"><figcaption>{html.escape(title)}</figcaption>'
            f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img">{ticks}'
            f'<polyline points="{pts}" class="series"/>'
            f'<text x="{W / 2}" y="{H - 6}" text-anchor="middle">step</text>'
            f'<text x="12" y="{H / 2}" transform="rotate(-90 12 {H / 2})" text-anchor="middle">{html.escape(ylabel)}</text>'
            f'</svg></figure>')


def _bar_chart(title: str, labels: Sequence[str], values: Sequence[float], unit: str) -> str:
    if not values:
        return f'<figure class="chart" data-chart="{html.escape(title)}"><figcaption>{html.escape(title)}: no data</figcaption></figure>'
    hi = max(values) or 1
    bh = 22
    height = PAD + bh * len(values)
    bars = "".join(
        f'<text x="120" y="{20 + i * bh + 15}" text-anchor="end">{html.escape(lab)}</text>'
        f'<rect x="126" y="{20 + i * bh + 3}" width="{max(1, v / hi * (W - 260)):.1f}" height="{bh - 6}" class="bar"/>'
        f'<text x="{132 + v / hi * (W - 260):.1f}" y="{20 + i * bh + 15}">{v:.3g} {unit}</text>'
        for i, (lab, v) in enumerate(zip(labels, values)))
    return (f'<figure class="chart" data-chart="{html.escape(title)}"><figcaption>{html.escape(title)}</figcaption>'
            f'<svg viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img">{bars}</svg></figure>')


def _smooth(ys: list[float], k: int = 10) -> list[float]:
    out, acc = [], []
    for y in ys:
        acc.append(y)
        acc = acc[-k:]
        out.append(sum(acc) / len(acc))
    return out


def _table(rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _usd(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x >= 1:
        return f"${x:,.2f}"
    return f"${x:.4f}" if x >= 0.01 else f"${x:.3g}"    # small CPU runs cost fractions of a cent


def write_report(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    eco = summary.get("economics", {})
    b, f = summary["base"], summary["final"]
    charts = [
        _line_chart("Held-out pass@1", [r["step"] for r in evals], [r["pass1"] for r in evals], "pass@1", 0, 1),
        _line_chart("Training reward (mean of 10 steps)", [r["step"] for r in train],
                    _smooth([r["reward"] for r in train]), "reward", 0, 1),
        _line_chart("GRPO loss", [r["step"] for r in train if "loss" in r],
                    [r["loss"] for r in train if "loss" in r], "loss"),
        _bar_chart("Wall seconds by phase", list(summary["phase_seconds"]), list(summary["phase_seconds"].values()), "s"),
    ]
    outcome = _table([["metric", "base", "final", "change"],
                      ["held-out pass@1", f"{b['pass1']:.1%}", f"{f['pass1']:.1%}", f"{100 * (f['pass1'] - b['pass1']):+.1f} pts"],
                      ["mean reward", f"{b['mean_reward']:.3f}", f"{f['mean_reward']:.3f}", f"{f['mean_reward'] - b['mean_reward']:+.3f}"]])
    econ_rows = [["quantity", "value"],
                 ["hardware profile", f"{eco.get('profile', '?')} at ${eco.get('usd_per_hour', 0):.2f}/h"],
                 ["run cost", _usd(eco.get("dollars"))],
                 ["post-training spend", _usd(eco.get("post_training_dollars"))],
                 ["cost per 1M generated tokens", _usd(eco.get("cost_per_1m_generated_tokens"))],
                 ["intelligence per dollar", "n/a" if eco.get("intelligence_per_dollar") is None
                  else f"{eco['intelligence_per_dollar']:,.1f} held-out points per $"],
                 ["estimated FLOPs", f"{eco.get('flops', 0):.3g}"]]
    proj_rows = [["profile (projection)", "seconds", "dollars", "assumption"]] + [
        [name, f"{p['seconds']:.3g}", _usd(p["dollars"]), p["assumption"]] for name, p in eco.get("projections", {}).items()]
    page = f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>gymloop report: {html.escape(run_dir.name)}</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1180px; color: #1d2330; }}
h1 {{ font-size: 22px; }} h2 {{ font-size: 17px; margin-top: 28px; }}
.charts {{ display: grid; grid-template-columns: repeat(auto-fill, minmax({W}px, 1fr)); gap: 12px; }}
figure.chart {{ margin: 0; padding: 8px; border: 1px solid #dde2ea; border-radius: 6px; }}
figcaption {{ font-weight: 600; margin-bottom: 4px; }}
svg text {{ font-size: 11px; fill: #4a5366; }}
.series {{ fill: none; stroke: #2f6fde; stroke-width: 2; }} .grid {{ stroke: #eef1f5; }}
.bar {{ fill: #2f6fde; }}
table {{ border-collapse: collapse; margin: 8px 0; }} td, th {{ border: 1px solid #dde2ea; padding: 4px 10px; text-align: left; }}
.note {{ color: #5b6477; }}
</style></head><body>
<h1>gymloop run {html.escape(run_dir.name)}</h1>
<p class="note">{html.escape(summary['env'])} · {summary['steps']} steps · {summary['heldout_tasks']} held-out tasks ·
{summary['tokens_generated']:,} tokens generated · {summary['wall_seconds']:.1f} s wall</p>
<h2>Outcome</h2>{outcome}
<h2>Curves and costs</h2><div class="charts">{''.join(charts)}</div>
<h2>Economics</h2>{_table(econ_rows)}
<h2>Projections to other hardware</h2><p class="note">Estimates from FLOPs and an assumed utilisation, not measurements.</p>{_table(proj_rows)}
</body></html>"""
    out = run_dir / "report.html"
    out.write_text(page)
    return out
