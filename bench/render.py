"""Render the results tables of bench/README.md and README.md from the committed results files.

    python -m bench.render           # rewrite the generated blocks in place
    python -m bench.render --check   # exit 1 (and say which) when a block differs from its files

A generated block is the text between

    <!-- results: GROUP/NAME -->    (or `GROUP/NAME latest`: the newest file only)
    <!-- /results -->

and holds, for every file of bench/results/NAME/ (newest first), the run's date, CPU, commit and
command line and each table the bench printed (common.table records them; save() writes them).
Nothing between the markers is typed by hand: edit the prose around them, re-run the bench to
change a figure. tests/unit/test_bench_results.py runs --check.

Lists that the code holds are rendered the same way, between `<!-- code: NAME -->` and
`<!-- /code -->` (CODE_TABLES: the built-in environments, the agent environment's options, the
benches' index from their BENCH declarations), so a doc never drifts from the code's own list.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent
RESULTS = HERE / "results"
DOCS = [HERE / "README.md", ROOT / "README.md", ROOT / "docs" / "guide.md", ROOT / "docs" / "agents.md"]
BLOCK = re.compile(r"(<!-- results: (?P<name>[\w./-]+)(?P<latest> latest)? -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)


CODE_BLOCK = re.compile(r"(<!-- code: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /code -->)", re.S)


def environments_table() -> list[list[str]]:
    """The built-in environments and what each verifies, from the registry."""
    from gymloop.envs.registry import BUILTIN

    return [["name", "what is verified"]] + [[f"`{e.name}`", e.description] for e in BUILTIN]


def agent_options_table() -> list[list[str]]:
    """The `agent` environment's options, from its config's field docs."""
    from gymloop.agents.env import AgentConfig

    return [["option", "what it is"]] + [[f"`{name}`", f.description or ""] for name, f in AgentConfig.model_fields.items()]


GROUPS = ("engines", "training", "learning", "serving", "sandbox")       # the index's order


def benches_table() -> list[list[str]]:
    """Every bench, by group, and what it measures: its own BENCH declaration (bench/run_all.py)."""
    from bench.run_all import declared

    found = declared()
    rows = [["bench (`python -m bench.GROUP.NAME`)", "measures"]]
    for group in GROUPS + tuple(sorted({m.split(".")[1] for m in found} - set(GROUPS))):
        mine = sorted(m for m in found if m.split(".")[1] == group)
        if mine:
            rows.append([f"**{group}**", ""])
            rows += [[f"`{m.removeprefix('bench.')}`", found[m]["measures"]] for m in mine]
    return rows


CODE_TABLES = {"environments": environments_table, "agent-options": agent_options_table, "benches": benches_table}


def render_code(text: str) -> str:
    """`text` with every code-rendered block made anew from CODE_TABLES."""
    return CODE_BLOCK.sub(lambda m: m.group(1) + markdown_table(CODE_TABLES[m.group("name")]()) + "\n" + m.group(4),
                          text)


def results_files(name: str, results: Path = RESULTS) -> list[Path]:
    """A bench's results files, newest run first."""
    def started(p: Path) -> tuple[str, str]:
        m = json.loads(p.read_text())["meta"]
        return m.get("time", m["date"]), p.name
    return sorted((results / name).glob("*.json"), key=started, reverse=True)


def markdown_table(rows: list[list[str]]) -> str:
    cell = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(cell(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return "\n".join(lines + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows[1:]])


def module_of(name: str) -> str:
    """The bench that writes results `name` (GROUP/NAME, a variant after a dash: GROUP/NAME-VARIANT)."""
    return "bench." + name.split("-", 1)[0].replace("/", ".")


def describe(meta: dict, name: str) -> str:
    """One line naming where and from what a results file came."""
    c = meta["cpu"]
    cpu = c["model_name"] + (f" (family {c['family']} model {c['model']})" if c.get("family") else "")
    sha = (meta.get("commit") or "unknown")[:7] + (" + uncommitted changes" if meta.get("dirty") else "")
    cmd = " ".join([f"python -m {module_of(name)}", *meta.get("argv", [])])
    return (f"*{meta['date']}, {cpu}, {c['cores']} cores, torch {meta['torch']}, commit {sha}: "
            f"`{cmd.strip()}`*")


def render_block(name: str, results: Path = RESULTS, latest: bool = False, doc_dir: Path = HERE) -> str:
    """Every results file of `name`, newest first (`latest`: the newest only); links relative to `doc_dir`."""
    files = results_files(name, results)[:1 if latest else None]
    if not files:
        raise FileNotFoundError(f"no results files for {name!r} under {results / name}: run bench/{name}.py")
    parts = []
    for path in files:
        data = json.loads(path.read_text())
        parts.append(describe(data["meta"], name) + f" ([raw]({Path(os.path.relpath(path, doc_dir)).as_posix()}))")
        for t in data["tables"]:
            parts.append((f"**{t['title']}**\n\n" if t.get("title") else "") + markdown_table(t["rows"]))
    return "\n\n".join(parts) + "\n"


def render_text(text: str, results: Path = RESULTS, doc_dir: Path = HERE) -> str:
    """`text` (a document in `doc_dir`) with every generated block re-rendered from `results`
    (and the code's lists from the code)."""
    text = render_code(text)
    return BLOCK.sub(lambda m: m.group(1) + "\n" + render_block(m.group("name"), results, bool(m.group("latest")),
                                                                doc_dir) + "\n" + m.group(5), text)


def blocks(text: str) -> list[str]:
    return [m.group("name") for m in BLOCK.finditer(text)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when a block is out of date")
    args = ap.parse_args()
    stale = []
    for doc in DOCS:
        text = doc.read_text()
        new = render_text(text, doc_dir=doc.parent)
        if new != text:
            stale.append(doc)
            if not args.check:
                doc.write_text(new)
    if args.check and stale:
        print("out of date with bench/results/ (run python -m bench.render): " + ", ".join(map(str, stale)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
