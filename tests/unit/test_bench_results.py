"""The benchmark figures in bench/README.md and README.md come from the committed results files:
the generated blocks equal what bench/render.py makes of bench/results/, every results folder is
shown somewhere, and the GRPO-vs-TRL tables follow from the raw runs stored beside them."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import render  # noqa: E402


def test_generated_blocks_match_the_results_files():
    for doc in render.DOCS:
        text = doc.read_text()
        assert render.render_text(text, doc_dir=doc.parent) == text, f"{doc} is out of date: run python -m bench.render"


def test_every_results_folder_is_shown_and_every_block_has_results():
    shown = {name for doc in render.DOCS for name in render.blocks(doc.read_text())}
    # results/<group>/<name>/: one folder per bench (and variant), named as its blocks name it
    folders = {str(p.parent.relative_to(render.RESULTS)) for p in render.RESULTS.glob("*/*/*.json")}
    assert folders, "no results committed under bench/results/"
    assert folders <= shown, f"results never shown in a README: {sorted(folders - shown)}"
    assert shown <= folders, f"blocks with no results files: {sorted(shown - folders)}"


def test_every_results_file_names_its_machine_and_commit():
    for path in render.RESULTS.glob("*/*/*.json"):
        data = json.loads(path.read_text())
        meta = data["meta"]
        assert data["bench"] == str(path.parent.relative_to(render.RESULTS))
        assert meta["cpu"]["model_name"] and meta["cpu"]["cores"] >= 1 and meta["torch"], path
        assert meta["commit"] and len(meta["commit"]) == 40, path
        assert data["tables"] and all(len(set(map(len, t["rows"]))) == 1 for t in data["tables"]), path


def _fake_results(tmp_path: Path, value: str, time: str = "2026-01-02T03:04:05+00:00", stem: str = "2026-01-02-some-cpu") -> Path:
    folder = tmp_path / "demos" / "demo_bench"
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"date": time[:10], "time": time, "commit": "a" * 40, "dirty": True,
            "cpu": {"model_name": "Some CPU", "family": "25", "model": "1", "cores": 2}, "torch": "2.13.0",
            "argv": ["--fast"]}
    tables = [{"title": "speed", "rows": [["case", "tok/s"], ["a|b", value]]}]
    (folder / f"{stem}.json").write_text(json.dumps({"bench": "demos/demo_bench", "meta": meta, "tables": tables}))
    return tmp_path


def test_a_block_is_rendered_from_its_file_and_follows_it(tmp_path):
    doc = "prose\n<!-- results: demos/demo_bench -->\nstale text\n<!-- /results -->\nmore prose\n"
    out = render.render_text(doc, _fake_results(tmp_path, "123"))
    assert out.startswith("prose\n<!-- results: demos/demo_bench -->\n") and out.endswith("<!-- /results -->\nmore prose\n")
    assert "stale text" not in out
    assert "| a\\|b | 123 |" in out and "**speed**" in out
    assert "Some CPU (family 25 model 1), 2 cores" in out and "commit aaaaaaa + uncommitted changes" in out
    assert "`python -m bench.demos.demo_bench --fast`" in out
    assert "| a\\|b | 456 |" in render.render_text(doc, _fake_results(tmp_path, "456"))


def test_every_run_is_shown_newest_first_or_the_newest_alone(tmp_path):
    _fake_results(tmp_path, "111", "2026-01-02T03:04:05+00:00", "2026-01-02-some-cpu")
    _fake_results(tmp_path, "222", "2026-01-03T03:04:05+00:00", "2026-01-03-some-cpu")
    every = render.render_text("<!-- results: demos/demo_bench -->\n<!-- /results -->\n", tmp_path)
    assert every.index("| 222 |") < every.index("| 111 |")
    newest = render.render_text("<!-- results: demos/demo_bench latest -->\n<!-- /results -->\n", tmp_path)
    assert "| 222 |" in newest and "| 111 |" not in newest


def test_a_block_without_results_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results files for 'nothing'"):
        render.render_text("<!-- results: nothing -->\n<!-- /results -->\n", tmp_path)


def test_grpo_vs_trl_tables_follow_from_its_raw_runs():
    from bench.learning import grpo_vs_trl
    files = sorted((render.RESULTS / "learning" / "grpo_vs_trl").glob("*.json"))
    assert files, "no grpo_vs_trl results committed"
    for path in files:
        data = json.loads(path.read_text())
        systems = list(data["systems"])
        assert len(data["cells"]) >= 6 and len({c["base_seed"] for c in data["cells"]}) >= 3, path
        stored = [(t["title"], t["rows"]) for t in data["tables"]]
        assert grpo_vs_trl.summary_tables(data["cells"], systems) == stored, path
        # both sides of the like-for-like pair ran on equal terms, as each reported its own settings
        for c in data["cells"]:
            ours, trl = c["runs"]["gymloop sync"]["settings"], c["runs"]["TRL"]["settings"]
            assert ours["torch_threads"] == trl["torch_threads"] == 1
            assert ours["gradient_checkpointing"] is False and trl["gradient_checkpointing"] is False
            assert ours["drop_zero_signal"] is False and trl["loss"] == "dapo"
            assert ours["precision"] == trl["precision"] == "float32"
            for key in ("lr", "warmup_steps", "betas", "max_grad_norm", "clip", "kl_beta", "prompts_per_step",
                        "group_size", "max_new_tokens", "temperature", "weight_decay"):
                assert ours[key] == trl[key], (path, key)
        # the order rotates: every system runs first in some cell
        assert {c["order"][0] for c in data["cells"]} == set(systems), path


def test_every_file_the_docs_link_to_is_committed():
    """A figure's output, story.json or script a README or guide links to is in the repository:
    tracked by git, not only on the machine that ran it (a `runs/` pattern once ignored docs/runs/,
    and outputs the README cited were lost with that machine)."""
    import re
    import subprocess

    root = ROOT
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    # committed, or about to be (a new file not ignored)
    tracked = set(subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                                 capture_output=True, text=True, check=True).stdout.splitlines())
    missing: set[str] = set()
    for doc in ["README.md", "bench/README.md", *(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))]:
        text = (root / doc).read_text()
        # markdown links are relative to their document; docs/runs/... named in prose, to the root
        links = [((root / doc).parent, t) for t in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in t]
        named = [(root, t) for t in re.findall(r"(?<![\w/.])(docs/runs/[\w.-]+)", text)]
        for base, target in links + named:
            path = (base / target).resolve()
            rel = str(path.relative_to(root)) if path.is_relative_to(root) else target
            if rel not in tracked and not any(t.startswith(rel.rstrip("/") + "/") for t in tracked):
                missing.add(f"{doc}: {target}")
    assert not missing, f"linked but not committed: {sorted(missing)}"
