"""`smollm2-calls`: SmolLM2-135M-Instruct taught to call tools, as a user would buy it: a
supervised fine-tuning job through gymloop's OpenAI-compatible API (the `openai` client, a
server on loopback) on demonstrations of the `calls` environment's training tools, in OpenAI's
function-calling format, every hyper-parameter `auto` but LoRA's rank; the adapter merged.

It is the agent chapter's production agent (configs/demo-agent.yaml), and a model name like any
other (bases/registry.py). It lives with the demos, not with bases, because it is made by running
the server, which sits above bases. Built once and cached under `models/smollm2-calls-<recipe hash>` (about 20 minutes on 2 CPU cores: 200 rows of ~380
tokens, 3 epochs); bench/learning/smollm2_tools.py measures the same job on held-out tools.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from ..models.cache import default_cache_dir

# What the job is made of; its hash names the cached model.
RECIPE = {"env": "calls", "split": "train", "rows": 200, "seed": 0, "lora": {"rank": 16, "alpha": 32.0},
          "hyperparameters": "auto"}


def recipe_key(recipe: dict = RECIPE) -> str:
    return hashlib.sha1(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]


def demonstrations(recipe: dict = RECIPE) -> list[dict]:
    """The job's training rows: the expected call of each sampled training task."""
    from ..envs import make_env

    env = make_env(recipe["env"])
    return [env.demonstration(t) for t in env.sample_tasks(recipe["rows"], recipe["split"], seed=recipe["seed"])]


def fine_tune(base: Path, rows: list[dict], lora: dict, out: Path, progress: bool = True) -> dict:
    """Run one supervised job of `base` on `rows` through the API and copy its model to `out`;
    the finished job (as the API returns it) is written beside it, in gymloop.json."""
    from openai import OpenAI

    from ..serve import ServeConfig
    from ..serve.background import serving
    from ..tracking.progress import progress as progress_bar

    key = "sk-build-" + secrets.token_hex(8)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ServeConfig(model=str(base), model_name="base", db=str(Path(tmp) / "store.db"), api_keys=[key],
                          jobs_dir=str(Path(tmp) / "jobs"))
        with serving(cfg) as (url, _, _store):
            client = OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=600)
            data = "\n".join(json.dumps(r) for r in rows).encode()
            f = client.files.create(file=("demonstrations.jsonl", io.BytesIO(data)), purpose="fine-tune")
            job = client.fine_tuning.jobs.create(model="base", training_file=f.id, suffix="calls", seed=0, method={
                "type": "supervised", "supervised": {"hyperparameters": {"lora": lora}}})
            bar = progress_bar(None, "smollm2-calls: supervised job", progress, "step")
            while job.status not in ("succeeded", "failed", "cancelled"):
                time.sleep(2.0)
                job = client.fine_tuning.jobs.retrieve(job.id)
                for e in client.fine_tuning.jobs.list_events(job.id, limit=1).data:
                    m = re.match(r"Step (\d+)/(\d+)", e.message)
                    if m:
                        bar.total = int(m.group(2))
                        bar.update(int(m.group(1)) - bar.n)
            bar.close()
            if job.status != "succeeded":
                raise RuntimeError(f"the smollm2-calls job {job.id} {job.status}: {job.error}")
            final = Path(cfg.jobs_dir) / job.id / "final"
            staging = out.with_name(out.name + ".partial")
            shutil.rmtree(staging, ignore_errors=True)
            shutil.copytree(final, staging)
            info = json.loads((staging / "gymloop.json").read_text())
            info["job"] = job.model_dump(mode="json")
            (staging / "gymloop.json").write_text(json.dumps(info, indent=2))
            staging.rename(out)           # a crash leaves no half-built model under the cached name
            return info


def ensure_smollm2_calls(cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """The cached smollm2-calls model, built by its supervised job only if not cached."""
    from ..bases.smollm2 import ensure_smollm2

    root = Path(cache_dir) if cache_dir else default_cache_dir()
    path = root / "models" / f"smollm2-calls-{recipe_key()}"
    if (path / "gymloop.json").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fine_tune(ensure_smollm2(cache_dir=cache_dir), demonstrations(), RECIPE["lora"], path, progress)
    return path
