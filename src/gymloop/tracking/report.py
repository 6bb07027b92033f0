"""`gymloop report RUN_DIR`: a self-contained report.html (inline SVG, no network) of a run.

Charts: held-out pass@1 per evaluation, training reward and loss per step, cost by phase;
tables: before/after, economics (cost per 1M tokens, intelligence per dollar, projections).
"""
from __future__ import annotations

import html
import math
import json
from pathlib import Path
from typing import Callable, Sequence

from .run_dir import read_metrics


W, H, PAD = 560, 220, 40
LEFT = 76          # room for tick labels like 1.23e+04 left of the plot


COLORS = ("#2f6fde", "#d9822b", "#2e9e5b", "#a34fd1", "#c23b3b", "#5b6477")


def _line_chart(title: str, xs: Sequence[float], ys: Sequence[float], ylabel: str,
                ymin: float | None = None, ymax: float | None = None, xlabel: str = "step") -> str:
    return _lines_chart(title, {ylabel: (xs, ys)}, ylabel, ymin, ymax, xlabel, legend=False)


def _lines_chart(title: str, series: dict[str, tuple[Sequence[float], Sequence[float]]], ylabel: str,
                 ymin: float | None = None, ymax: float | None = None, xlabel: str = "step",
                 dots: dict[str, Sequence[float]] | None = None, marks: Sequence[tuple[float, str]] = (),
                 legend: bool = True) -> str:
    """Several named series on shared axes; `dots[name]`: the xs of that series to circle (e.g.
    promotions); `marks`: vertical labelled lines (e.g. drift events)."""
    series = {k: v for k, v in series.items() if len(v[0])}
    if not series:
        return f'<figure class="chart" data-chart="{html.escape(title)}"><figcaption>{html.escape(title)}: no data</figcaption></figure>'
    all_x = [x for xs, _ in series.values() for x in xs] + [m[0] for m in marks]
    all_y = [y for _, ys in series.values() for y in ys]
    lo = min(all_y) if ymin is None else ymin
    hi = max(all_y) if ymax is None else ymax
    hi = hi if hi > lo else lo + 1
    x0, x1 = min(all_x), max(all_x) if max(all_x) > min(all_x) else min(all_x) + 1
    sx = lambda x: LEFT + (x - x0) / (x1 - x0) * (W - LEFT - PAD)  # noqa: E731
    sy = lambda y: H - PAD - (y - lo) / (hi - lo) * (H - 2 * PAD)  # noqa: E731
    ticks = "".join(
        f'<text x="{LEFT - 4}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>'
        f'<line x1="{LEFT}" x2="{W - PAD}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" class="grid"/>'
        for v in (lo, (lo + hi) / 2, hi))
    ticks += x_ticks(x0, x1, sx, whole=all(float(x).is_integer() for x in all_x))
    body = "".join(f'<line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{PAD / 2}" y2="{H - PAD}" class="mark"/>'
                   f'<text x="{sx(x) + 3:.1f}" y="{PAD / 2 + 10}" class="mark-label">{html.escape(label)}</text>'
                   for x, label in marks)
    for i, (name, (xs, ys)) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys))
        body += f'<polyline points="{pts}" class="series" style="stroke:{color}"/>'
        at = dict(zip(xs, ys))
        body += "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(at[x]):.1f}" r="4" style="fill:{color}"/>'
                        for x in (dots or {}).get(name, ()) if x in at)
        if legend:
            body += (f'<rect x="{W - PAD - 120}" y="{8 + 14 * i}" width="10" height="3" style="fill:{color}"/>'
                     f'<text x="{W - PAD - 106}" y="{13 + 14 * i}">{html.escape(name)}</text>')
    return (f'<figure class="chart" data-chart="{html.escape(title)}"><figcaption>{html.escape(title)}</figcaption>'
            f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img">{ticks}{body}'
            f'<text x="{W / 2}" y="{H - 6}" text-anchor="middle">{html.escape(xlabel)}</text>'
            f'<text x="11" y="{H / 2}" transform="rotate(-90 11 {H / 2})" text-anchor="middle">{html.escape(ylabel)}</text>'
            f'</svg></figure>')


def x_ticks(x0: float, x1: float, sx: Callable[[float], float], n: int = 5, whole: bool = False) -> str:
    """Labels under the x axis at up to `n` round values in [x0, x1]; `whole` (steps, rounds):
    whole numbers only."""
    raw = (x1 - x0) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    step = max(step, 1) if whole else step
    first = math.ceil(x0 / step) * step
    values = [first + i * step for i in range(int((x1 - first) // step) + 1)] or [x0]
    return "".join(f'<text x="{sx(v):.1f}" y="{H - PAD + 14}" text-anchor="middle" class="xtick">{v:g}</text>'
                   for v in values)


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


def _projections(projections: dict) -> str:
    """The section on other hardware, always labelled as estimates (ledger.project)."""
    rows = [["profile (projection)", "seconds", "dollars", "$ per 1M generated tokens", "assumption"]] + [
        [name, f"{p['seconds']:.3g}", _usd(p["dollars"]),
         "n/a" if p.get("usd_per_1m_generated_tokens") is None else _usd(p["usd_per_1m_generated_tokens"]),
         p["assumption"]] for name, p in projections.items()]
    return ("<h2>Projections to other hardware</h2><p class=\"note\">Estimates from FLOPs and an assumed "
            f"utilisation, not measurements.</p>{_table(rows)}")


CSS = f"""
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1180px; color: #1d2330; }}
h1 {{ font-size: 22px; }} h2 {{ font-size: 17px; margin-top: 28px; }}
.charts {{ display: grid; grid-template-columns: repeat(auto-fill, minmax({W}px, 1fr)); gap: 12px; }}
figure.chart {{ margin: 0; padding: 8px; border: 1px solid #dde2ea; border-radius: 6px; }}
figcaption {{ font-weight: 600; margin-bottom: 4px; }}
svg text {{ font-size: 11px; fill: #4a5366; }}
.series {{ fill: none; stroke: #2f6fde; stroke-width: 2; }} .grid {{ stroke: #eef1f5; }}
.mark {{ stroke: #c23b3b; stroke-dasharray: 4 3; }} svg text.mark-label {{ fill: #c23b3b; }}
.bar {{ fill: #2f6fde; }}
table {{ border-collapse: collapse; margin: 8px 0; }} td, th {{ border: 1px solid #dde2ea; padding: 4px 10px; text-align: left; }}
.note {{ color: #5b6477; }}
"""


def _page(title: str, note: str, body: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>'
            f'<p class="note">{html.escape(note)}</p>{body}</body></html>')


def write_report(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_metrics(run_dir)
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
                      ["mean reward", f"{b['mean_reward']:.3f}", f"{f['mean_reward']:.3f}", f"{f['mean_reward'] - b['mean_reward']:+.3f}"]]
                     ) if b is not None else "<p>No held-out evaluation (eval.tasks: 0).</p>"
    econ_rows = [["quantity", "value"],
                 ["hardware profile", f"{eco.get('profile', '?')} at ${eco.get('usd_per_hour', 0):.2f}/h"],
                 ["run cost", _usd(eco.get("dollars"))],
                 ["post-training spend", _usd(eco.get("post_training_dollars"))],
                 ["cost per 1M generated tokens", _usd(eco.get("cost_per_1m_generated_tokens"))],
                 ["intelligence per dollar", "n/a" if eco.get("intelligence_per_dollar") is None
                  else f"{eco['intelligence_per_dollar']:,.1f} held-out points per $"],
                 ["estimated FLOPs", f"{eco.get('flops', 0):.3g}"]]
    if "parameters" in summary:
        # FLOPs and projected costs count the active ones (an MoE token uses its top-k experts)
        econ_rows.append(["parameters / active per token",
                          f"{summary['parameters']:,} / {summary['active_parameters']:,}"])
    if sv := summary.get("serving"):
        econ_rows += [["served requests / tokens", f"{sv['requests']} / {sv['served_tokens']:,}"],
                      ["serving cost", _usd(sv["dollars"])],
                      ["cost per 1M served tokens", _usd(sv["cost_per_1m_served_tokens"])],
                      ["production success (verifier feedback)", f"{sv['production_success']:.1%}"]]
    note = (f"{summary['env']} · {summary['steps']} steps · {summary['heldout_tasks']} held-out tasks · "
            f"{summary['tokens_generated']:,} tokens generated · {summary['wall_seconds']:.1f} s wall")
    page = _page(f"gymloop run {run_dir.name}", note,
                 f"<h2>Outcome</h2>{outcome}"
                 f"<h2>Curves and costs</h2><div class=\"charts\">{''.join(charts)}</div>"
                 f"<h2>Economics</h2>{_table(econ_rows)}"
                 + _projections(eco.get("projections", {})))
    out = run_dir / "report.html"
    out.write_text(page)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _round_lines(title: str, rounds: list[dict], fields: dict[str, str], ylabel: str,
                 ymin: float | None = None, ymax: float | None = None) -> str:
    """One series per training statistic (`fields`: label -> key of a round's `training`)."""
    series = {}
    for label, key in fields.items():
        pts = [(r["round"], r["training"][key]) for r in rounds if r["training"].get(key) is not None]
        series[label] = ([x for x, _ in pts], [y for _, y in pts])
    return _lines_chart(title, series, ylabel, ymin, ymax, "round", dots={k: v[0] for k, v in series.items()},
                        legend=len(fields) > 1)


def write_loop_report(loop_dir: str | Path) -> Path:
    """report.html of a loop from its summary.json (see loop_summary): scores per suite per
    round with promotions (dots) and drift events (dashed lines), production success,
    cost per phase, intelligence per dollar over rounds, and what each drift cost to recover."""
    loop_dir = Path(loop_dir)
    s = json.loads((loop_dir / "summary.json").read_text())
    rounds = s["rounds"]
    xs = [r["round"] for r in rounds]
    suites = sorted({k for r in rounds for k in r["served"]})
    envs = sorted({k for r in rounds for k in r["production"]})
    promoted = [r["round"] for r in rounds if r["status"] == "promoted"]
    drift = [(e["round"], f"drift {e['env']}") for e in s["drift_events"]]
    phase_dollars: dict[str, float] = {}
    for r in rounds:
        for k, v in r["phase_dollars"].items():
            phase_dollars[k] = phase_dollars.get(k, 0.0) + v
    prod = {k: ([r["round"] for r in rounds if k in r["production"]],
                [r["production"][k] for r in rounds if k in r["production"]]) for k in envs}
    ipd = [(r["round"], r["intelligence_per_dollar"]) for r in rounds if r["intelligence_per_dollar"] is not None]
    charts = [
        # round 0: the model the loop started from
        _lines_chart("Held-out score of the served model per round",
                     {k: ([x for x, y in pts if y is not None], [y for _, y in pts if y is not None])
                      for k in suites
                      for pts in [list(zip([0, *xs], [s["base_scores"].get(k), *(r["served"].get(k) for r in rounds)]))]}, "pass@1", 0, 1, "round", dots={k: promoted for k in suites}, marks=drift),
        _lines_chart("Production success rate per round", prod, "success", 0, 1, "round",
                     dots={k: v[0] for k, v in prod.items()}, marks=drift),
        _round_lines("Training reward per round (mean of the first and last tenth of steps)", rounds,
                     {"first": "reward_first", "last": "reward_last"}, "reward", 0, 1),
        _round_lines("GRPO loss per round (mean)", rounds, {"loss": "loss_mean"}, "loss"),
        _round_lines("Generation throughput per round", rounds, {"tokens/s": "tokens_per_s"}, "tokens/s", 0),
        _bar_chart("Post-training dollars by phase", list(phase_dollars), list(phase_dollars.values()), "$"),
        _line_chart("Intelligence per dollar (points from base per $ spent)",
                    [x for x, _ in ipd], [y for _, y in ipd], "points/$", xlabel="round"),
    ]
    table = [["round", "version", "status", "served", *[f"{k} after" for k in suites],
              *[f"prod {k}" for k in envs], "cost", "why"]]
    for r in rounds:
        table.append([str(r["round"]), f"v{r['version']}", r["status"], f"v{r['served_version']}",
                      *[_pct(r["after"].get(k)) for k in suites],
                      *[_pct(r["production"].get(k)) for k in envs], _usd(r["dollars"]), r["why"]])
    maintain = [["drift", "round", "pre-drift", "cost to maintain", "status"]] + [
        [f"{c['env']} ({c['kind']})", str(c["round"]), _pct(c["pre_drift"]), _usd(c["dollars"]), c["status"]]
        for c in s["cost_to_maintain"]]
    econ = [["quantity", "value"],
            ["post-training spend", _usd(s["post_training_dollars"])],
            [f"{s['target']} points gained from base",
             "n/a" if s["points_gained"] is None else f"{s['points_gained']:+.1f}"],
            ["intelligence per dollar", "n/a" if s["intelligence_per_dollar"] is None
             else f"{s['intelligence_per_dollar']:,.1f} held-out points per $"],
            ["promotions", str(s["promotions"])],
            ["cost per 1M served tokens", _usd(s["cost_per_1m_served_tokens"])]]
    note = f"target {s['target']} · {len(rounds)} rounds · {s['promotions']} promoted · gate epsilon {s['epsilon']}"
    page = _page(f"gymloop loop {s['run_id']}", note,
                 f"<h2>Rounds</h2>{_table(table)}<h2>Curves and costs</h2><div class=\"charts\">{''.join(charts)}</div>"
                 f"<h2>Economics</h2>{_table(econ)}"
                 f"<h2>Cost to maintain</h2><p class=\"note\">Dollars from the round a drift was seen until the "
                 f"served score was back within epsilon of its pre-drift value.</p>"
                 + (_table(maintain) if len(maintain) > 1 else "<p>No drift events.</p>")
                 + _projections(s.get("projections", {})))
    out = loop_dir / "report.html"
    out.write_text(page)
    return out
