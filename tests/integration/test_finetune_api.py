"""The fine-tuning API end to end: a real `gymloop serve` (a thread), the official `openai`
client unchanged, real training jobs on a tiny model in the server's worker."""
from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import pytest
from openai import NotFoundError, OpenAI

from gymloop.serve import ServeConfig, build, shutdown

from conftest import eventually, running_server

KEY, OTHER, ADMIN = "sk-tenant-a", "sk-tenant-b", "sk-admin"


def _jsonl(rows) -> bytes:
    return "\n".join(json.dumps(r) for r in rows).encode() + b"\n"


def sft_rows(n=24):
    return [{"messages": [{"role": "user", "content": f"{i % 7}+1="},
                          {"role": "assistant", "content": str(i % 7 + 1)}]} for i in range(n)]


def dpo_rows(n=16):
    return [{"input": {"messages": [{"role": "user", "content": f"{i % 5}+2="}]},
             "preferred_output": [{"role": "assistant", "content": str(i % 5 + 2)}],
             "non_preferred_output": [{"role": "assistant", "content": "9"}]} for i in range(n)]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("ft")
    cfg = ServeConfig(model=str(tiny_model_dir), model_name="tiny", db=str(root / "store.db"), api_keys=[KEY, OTHER],
                      admin_keys=[ADMIN], jobs_dir=str(root / "jobs"), checkpoint_every=2, poll_s=0.2)
    app, batcher, store = build(cfg)
    with running_server(app) as base:
        yield {"base": base, "store": store, "app": app}
    shutdown(app)


@pytest.fixture()
def client(server):
    return OpenAI(base_url=server["base"] + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture()
def other(server):
    return OpenAI(base_url=server["base"] + "/v1", api_key=OTHER, max_retries=0)


def upload(client, rows_or_bytes, name="train.jsonl"):
    data = rows_or_bytes if isinstance(rows_or_bytes, bytes) else _jsonl(rows_or_bytes)
    return client.files.create(file=(name, io.BytesIO(data)), purpose="fine-tune")


def wait(client, job_id, statuses=("succeeded", "failed", "cancelled"), timeout=120):
    """The job once its status is one of `statuses`."""
    def reached():
        job = client.fine_tuning.jobs.retrieve(job_id)
        return job if job.status in statuses else None
    return eventually(reached, timeout, f"job {job_id} reaches {statuses}", every_s=0.2)


def event_seen(client, job_id, prefix: str, timeout: float = 120) -> str:
    """The first event message of the job that starts with `prefix`, once there is one."""
    return eventually(lambda: next((m for m in events_of(client, job_id) if m.startswith(prefix)), None), timeout,
                      f"an event {prefix!r} of {job_id}", every_s=0.1)


def test_files_are_validated_on_upload_and_kept(client):
    f = upload(client, sft_rows(3))
    assert f.status == "processed" and f.purpose == "fine-tune" and f.bytes == len(_jsonl(sft_rows(3)))
    assert client.files.retrieve(f.id).id == f.id
    assert client.files.content(f.id).read() == _jsonl(sft_rows(3))
    assert f.id in [x.id for x in client.files.list()]
    bad = {
        b'{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n{oops\n':
            "line 2: not JSON",
        _jsonl(sft_rows(2) + [{"messages": [{"role": "user", "content": "no answer"}]}]):
            "line 3: no assistant message",
        _jsonl([{"messages": [{"role": "hacker", "content": "x"}, {"role": "assistant", "content": "y"}]}]):
            "line 1: messages[0]: unknown role 'hacker'",
        _jsonl(dpo_rows(1) + [{k: v for k, v in dpo_rows(1)[0].items() if k != "non_preferred_output"}]):
            "line 2: missing non_preferred_output",
    }
    for data, message in bad.items():
        f = upload(client, data)
        assert f.status == "error" and f.status_details.startswith(message), f.status_details
        assert client.files.content(f.id).read() == data             # kept as sent
        with pytest.raises(Exception, match="not a valid training file"):
            client.fine_tuning.jobs.create(model="tiny", training_file=f.id)
    gone = upload(client, sft_rows(1))
    assert client.files.delete(gone.id).deleted
    with pytest.raises(NotFoundError):
        client.files.retrieve(gone.id)


def test_a_supervised_job_trains_reports_and_serves_its_model(client, other):
    f = upload(client, sft_rows())
    job = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, suffix="plus1", seed=3,
                                         metadata={"team": "a"},
                                         method={"type": "supervised", "supervised": {"hyperparameters": {
                                             "n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 3}}})
    assert job.status == "queued" and job.seed == 3 and job.hyperparameters.n_epochs == 2
    assert job.organization_id and job.result_files == [] and job.method.type == "supervised"
    done = wait(client, job.id)
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model.startswith("ft:tiny:") and ":plus1:" in done.fine_tuned_model
    assert done.trained_tokens > 0 and done.finished_at >= done.created_at
    events = list(client.fine_tuning.jobs.list_events(done.id, limit=100))
    assert events[0].message == "The job has successfully completed"            # newest first
    steps = [e.data["step"] for e in events if e.type == "metrics"]
    assert steps == sorted(steps, reverse=True) and max(steps) == 12              # 24 rows / 4 x 2 epochs
    assert all("train_loss" in e.data for e in events if e.type == "metrics")
    ckpts = list(client.fine_tuning.jobs.checkpoints.list(done.id))
    assert [c.step_number for c in ckpts] == [12, 10, 8, 6, 4, 2] and ckpts[0].id.startswith("ftckpt")
    assert ckpts[0].fine_tuned_model_checkpoint == f"{done.fine_tuned_model}:ckpt-step-12"
    csv = client.files.content(done.result_files[0]).read().decode().splitlines()
    assert csv[0].startswith("step,") and len(csv) == 13
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"team": "a"})] == [done.id]
    # the model, listed and served by id (and a checkpoint too)
    assert done.fine_tuned_model in [m.id for m in client.models.list()]
    for model in (done.fine_tuned_model, ckpts[-1].fine_tuned_model_checkpoint):
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "3+1="}], max_tokens=3)
        assert r.model == model and r.choices[0].message.content is not None
    # another tenant sees none of it
    assert done.fine_tuned_model not in [m.id for m in other.models.list()]
    for call in (lambda: other.fine_tuning.jobs.retrieve(done.id), lambda: other.files.retrieve(f.id),
                 lambda: other.fine_tuning.jobs.list_events(done.id),
                 lambda: other.chat.completions.create(model=done.fine_tuned_model,
                                                      messages=[{"role": "user", "content": "x"}])):
        with pytest.raises(NotFoundError):
            call()
    assert other.fine_tuning.jobs.list().data == []
    # continued training from the fine-tuned model
    more = client.fine_tuning.jobs.create(model=done.fine_tuned_model, training_file=f.id,
                                          method={"type": "supervised",
                                                  "supervised": {"hyperparameters": {"n_epochs": 1}}})
    assert wait(client, more.id).status == "succeeded"


def test_a_dpo_job(client):
    f = upload(client, dpo_rows())
    job = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method={
        "type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2, "n_epochs": 2, "batch_size": 4}}})
    assert job.method.type == "dpo" and job.method.dpo.hyperparameters.beta == 0.2
    done = wait(client, job.id)
    assert done.status == "succeeded", done.error
    metrics = [e.data for e in client.fine_tuning.jobs.list_events(done.id, limit=100) if e.type == "metrics"]
    assert len(metrics) == 8 and all("reward_margin" in m for m in metrics)
    # a supervised file is not a DPO one
    sft = upload(client, sft_rows(4))
    with pytest.raises(Exception, match="needs dpo"):
        client.fine_tuning.jobs.create(model="tiny", training_file=sft.id, method={"type": "dpo"})


def events_of(client, job_id):
    return [e.message for e in client.fine_tuning.jobs.list_events(job_id, limit=100)]


def test_cancel_pause_and_resume(server, client):
    f = upload(client, sft_rows(64))
    # long enough (64k steps) never to finish during the test: it is cancelled
    hp = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1000, "batch_size": 1}}}
    job = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method=hp)
    wait(client, job.id, ("running",))
    paused = client.fine_tuning.jobs.pause(job.id)
    assert paused.status == "paused"
    with pytest.raises(Exception, match="cannot pause"):
        client.fine_tuning.jobs.pause(job.id)
    event_seen(client, job.id, "Paused at step")        # the worker stops at its next step
    resumed = client.fine_tuning.jobs.resume(job.id)
    assert resumed.status == "queued"
    wait(client, job.id, ("running",))
    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled"
    worker = server["app"].state.services.worker
    eventually(lambda: worker.current is None, 60, "the worker lets go of the cancelled job")
    final = client.fine_tuning.jobs.retrieve(job.id)
    assert final.status == "cancelled" and final.fine_tuned_model is None
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100)]
    assert "Job paused" in messages and "Job resumed" in messages and "Job cancelled" in messages
    assert any(m.startswith("Resumed from the checkpoint at step") for m in messages)


def test_bad_requests_are_clear(client):
    with pytest.raises(NotFoundError, match="No such File"):
        client.fine_tuning.jobs.create(model="tiny", training_file="file-nope")
    f = upload(client, sft_rows(4))
    with pytest.raises(NotFoundError, match="not a base model"):
        client.fine_tuning.jobs.create(model="gpt-17", training_file=f.id)
    with pytest.raises(Exception, match="method.type"):
        client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method={"type": "ppo"})


def download(server, job_id, ckpt_id, fmt, dest):
    """A checkpoint's archive, unpacked under dest; returns its one directory."""
    import tarfile

    import httpx

    r = httpx.get(f"{server['base']}/v1/fine_tuning/jobs/{job_id}/checkpoints/{ckpt_id}/content",
                  params={"format": fmt}, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    if r.status_code != 200:
        return r
    (dest / "a.tar.gz").write_bytes(r.content)
    with tarfile.open(dest / "a.tar.gz") as tar:
        tar.extractall(dest / fmt, filter="data")
    (top,) = (dest / fmt).iterdir()
    return top


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_a_lora_job_saves_a_peft_adapter_that_hugging_face_loads(client, server, tiny_model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    f = upload(client, sft_rows(16))
    lora = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    job = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method={"type": "supervised", "supervised": {
        "hyperparameters": {"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 20, "lora": lora}}})
    done = wait(client, job.id)
    assert done.status == "succeeded", done.error
    assert done.method.supervised.hyperparameters.lora == {**lora, "dropout": 0.0}
    last = next(iter(client.fine_tuning.jobs.checkpoints.list(done.id)))
    adapter = download(server, done.id, last.id, "adapter", tmp_path)
    merged = download(server, done.id, last.id, "merged", tmp_path)
    assert {p.name for p in adapter.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    assert not {"train_state.pt", "adapter"} & {p.name for p in merged.iterdir()}
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.tensor([[1, 5, 9, 12, 3]])
    with torch.no_grad():
        before = base(ids).logits
        peft_logits = PeftModel.from_pretrained(base, adapter).eval()(ids).logits
        merged_logits = AutoModelForCausalLM.from_pretrained(merged)(ids).logits
    assert not torch.allclose(before, peft_logits, atol=1e-4)          # the adapter learned something
    assert torch.allclose(peft_logits, merged_logits, atol=1e-4)        # and merging keeps what it does
    # only the adapters trained: the merged weights differ from the base only where adapters sit
    changed = {n.split(".")[-2] for n, p in AutoModelForCausalLM.from_pretrained(merged).named_parameters()
               if not torch.equal(p, dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())[n])}
    assert changed == {"q_proj", "v_proj"}
    # a job that trained every weight has no adapter to download; an unknown format is a 400
    full = wait(client, client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method={
        "type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 8}}}).id)
    ckpt = next(iter(client.fine_tuning.jobs.checkpoints.list(full.id)))
    assert download(server, full.id, ckpt.id, "adapter", tmp_path).status_code == 409
    assert download(server, full.id, ckpt.id, "zip", tmp_path).status_code == 400


def rft_rows(n=16):
    """Prompts whose grader wants a reply that starts with the row's digit (a random tiny model
    does that ~1 time in 10, so GRPO has something to learn)."""
    return [{"messages": [{"role": "user", "content": "abcxyz"[i % 6]}], "digit": str(i % 10)} for i in range(n)]


DIGIT_GRADER = {"type": "python", "name": "starts_with_a_digit",
                "source": "def grade(sample, item):\n    t = sample['output_text']\n"
                          "    return float(bool(t) and t[0].isdigit())\n"}


def test_a_reinforcement_job_with_a_python_grader_learns(client, server):
    train, valid = upload(client, rft_rows(16)), upload(client, rft_rows(8), "valid.jsonl")
    assert train.status == "processed"
    job = client.fine_tuning.jobs.create(model="tiny", training_file=train.id, validation_file=valid.id, seed=0, method={
        "type": "reinforcement", "reinforcement": {"grader": DIGIT_GRADER, "hyperparameters": {
            "n_epochs": 20, "batch_size": 8, "group_size": 8, "max_new_tokens": 1, "learning_rate_multiplier": 30,
            "eval_samples": 8}}})
    assert job.method.type == "reinforcement" and job.method.reinforcement.grader.type == "python"
    done = wait(client, job.id, timeout=300)
    assert done.status == "succeeded", done.error
    events = list(client.fine_tuning.jobs.list_events(done.id, limit=100))
    summary = next(e for e in events if e.message.startswith("Held-out mean reward"))
    assert summary.data["final_mean_reward"] > summary.data["base_mean_reward"] + 0.3, summary.message
    metrics = [e.data for e in events if e.type == "metrics"]
    assert len(metrics) == 40 and all(m["grader_errors"] == 0 for m in metrics)
    assert [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(done.id, limit=100)][:2] == [40, 38]
    r = client.chat.completions.create(model=done.fine_tuned_model, messages=[{"role": "user", "content": "a"}],
                                       max_tokens=1, temperature=0)
    assert r.choices[0].message.content[:1].isdigit()
    assert {r["run_id"] for r in server["store"].ledger.rows("fine_tuning")} >= {done.id}


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_a_lora_reinforcement_job_learns_and_its_adapter_loads(client, server, tiny_model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    f = upload(client, rft_rows(16))
    job = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, seed=0, method={
        "type": "reinforcement", "reinforcement": {"grader": DIGIT_GRADER, "hyperparameters": {
            "n_epochs": 20, "batch_size": 8, "group_size": 8, "max_new_tokens": 1, "learning_rate_multiplier": 30,
            "eval_samples": 8, "lora": {"rank": 8, "alpha": 32}}}})
    done = wait(client, job.id, timeout=300)
    assert done.status == "succeeded", done.error
    summary = next(e for e in client.fine_tuning.jobs.list_events(done.id, limit=100)
                   if e.message.startswith("Held-out mean reward"))
    assert summary.data["final_mean_reward"] > summary.data["base_mean_reward"] + 0.3, summary.message
    last = next(iter(client.fine_tuning.jobs.checkpoints.list(done.id)))
    adapter = download(server, done.id, last.id, "adapter", tmp_path)
    merged = download(server, done.id, last.id, "merged", tmp_path)
    ids = torch.tensor([[1, 5, 9, 12, 3]])
    with torch.no_grad():
        a = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter).eval()(ids).logits
        b = AutoModelForCausalLM.from_pretrained(merged)(ids).logits
    assert torch.allclose(a, b, atol=1e-4)


def test_reinforcement_grader_errors_are_errors_not_zero_rewards(client):
    f = upload(client, rft_rows(8))
    # a template naming a field the rows lack: every sample is a grader error, none is trained on
    grader = {"type": "string_check", "name": "s", "input": "{{sample.output_text}}", "reference": "{{item.nope}}",
              "operation": "eq"}
    job = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method={
        "type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": {
            "n_epochs": 1, "batch_size": 4, "group_size": 2, "max_new_tokens": 1, "eval_samples": 2}}})
    done = wait(client, job.id, timeout=120)
    metrics = [e.data for e in client.fine_tuning.jobs.list_events(done.id, limit=100) if e.type == "metrics"]
    assert [m["grader_errors"] for m in metrics] == [8, 8]
    # a grader that is not well-formed never becomes a job
    for bad, match in (({"type": "python", "source": "def grade(:"}, "does not parse"),
                       ({"type": "multi", "graders": {"a": DIGIT_GRADER}, "calculate_output": "a ** 2"}, "calculate_output"),
                       ({"type": "score_model", "model": "gpt-17", "input": [{"role": "user", "content": "x"}]},
                        "not served")):
        with pytest.raises(Exception, match=match):
            client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method={
                "type": "reinforcement", "reinforcement": {"grader": bad}})
    with pytest.raises(Exception, match="grader"):
        client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method={"type": "reinforcement"})


@pytest.mark.parametrize("lora", [None, {"rank": 4}])
def test_a_paused_reinforcement_job_resumes_where_it_stopped(client, lora):
    f = upload(client, rft_rows(8))
    job = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method={
        "type": "reinforcement", "reinforcement": {"grader": DIGIT_GRADER, "hyperparameters": {
            "n_epochs": 1000, "batch_size": 4, "group_size": 2, "max_new_tokens": 1, "eval_samples": 2,
            **({"lora": lora} if lora else {})}}})
    eventually(lambda: [e for e in client.fine_tuning.jobs.list_events(job.id, limit=5) if e.type == "metrics"],
               120, "the job's first step", every_s=0.2)
    client.fine_tuning.jobs.pause(job.id)
    event_seen(client, job.id, "Paused at step")
    paused = next(e for e in client.fine_tuning.jobs.list_events(job.id, limit=100) if e.message.startswith("Paused"))
    paused_at = int(paused.message.removeprefix("Paused at step ").split(";")[0])
    assert [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id)][0] == paused_at
    client.fine_tuning.jobs.resume(job.id)
    event_seen(client, job.id, "Resumed from the checkpoint at step")

    def steps_past_the_pause():          # the next step after the resume is the one after the pause
        later = [e.data["step"] for e in client.fine_tuning.jobs.list_events(job.id, limit=100) if e.type == "metrics"]
        return later if max(later) > paused_at else None
    steps = sorted(eventually(steps_past_the_pause, 120, "a step after the pause", every_s=0.2))
    assert steps == list(range(1, max(steps) + 1))          # no step lost or repeated across the pause
    assert client.fine_tuning.jobs.cancel(job.id).status == "cancelled"


def test_an_admin_promotes_a_fine_tuned_model_through_the_gate(server, client, digit_env, tmp_path, capsys):
    from openai import PermissionDeniedError

    from gymloop.cli import main

    admin = OpenAI(base_url=server["base"] + "/v1", api_key=ADMIN, max_retries=0)
    store = server["store"]

    def job(answer: str) -> str:
        rows = [{"messages": [{"role": "user", "content": c}, {"role": "assistant", "content": answer}]}
                for c in "abcxyz" * 4]
        j = admin.fine_tuning.jobs.create(model="tiny", training_file=upload(admin, rows).id, method={
            "type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 3, "batch_size": 4,
                                                                      "learning_rate_multiplier": 20}}})
        done = wait(admin, j.id)
        assert done.status == "succeeded", done.error
        return done.id

    request = {"env": {"name": "digit"}, "eval_tasks": 16, "max_new_tokens": 1, "gate": {"delta": 0.2}}
    digits, letters = job("7"), job("q")
    with pytest.raises(PermissionDeniedError, match="admin key"):
        client.post(f"/fine_tuning/jobs/{digits}/promote", body=request, cast_to=object)
    with pytest.raises(NotFoundError):                     # another tenant's job: it does not exist for this key
        admin.post(f"/fine_tuning/jobs/{digits}x/promote", body=request, cast_to=object)
    better = admin.post(f"/fine_tuning/jobs/{digits}/promote", body=request, cast_to=object)
    assert better["promoted"], better
    assert better["after"]["digit"] >= better["before"]["digit"] + 0.2
    assert store.versions.promoted()["version"] == better["version"] and better["production_version"] == 1
    # the server follows the store: the served model is now the promoted one
    eventually(lambda: int(client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "a"}], max_tokens=1).headers["x-gymloop-model-version"])
        == better["version"], 30, "the server serves the promoted version", every_s=0.2)
    worse = admin.post(f"/fine_tuning/jobs/{letters}/promote", body=request, cast_to=object)
    assert not worse["promoted"] and "digit changed by" in worse["why"]
    assert store.versions.promoted()["version"] == better["version"]
    messages = [e.message for e in admin.fine_tuning.jobs.list_events(letters, limit=100)]
    assert any(m.startswith("Not promoted") for m in messages)
    # `gymloop models add` takes a fine-tuned model's id
    model = admin.fine_tuning.jobs.retrieve(letters).fine_tuned_model
    assert main(["models", "add", model, "--db", store.url]) == 0
    added = json.loads(capsys.readouterr().out)
    row = store.versions.get(added["version"])
    assert row["status"] == "candidate"
    assert Path(row["path"]) == Path(store.jobs.get(None, letters)["final_path"]).resolve()
    assert main(["models", "add", "ft:nope", "--db", store.url]) == 2


def _process(args: list[str], port: int | None = None):
    """`python -m gymloop.cli ARGS` as a process; with `port`, once its server answers /healthz."""
    import os
    import subprocess
    import sys

    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "gymloop.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ})

    def answers():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).json()
        except httpx.HTTPError:
            return None
    if port is not None:
        eventually(answers, 60, "the server answers /healthz", every_s=0.2,
                   unless=lambda: proc.poll() is not None and "the server exited")
    return proc


def _killed_mid_job(client, job_id: str, proc, db) -> int:
    """SIGKILL `proc` once the job has a checkpoint; the job is still `running` in the store.
    Returns the newest checkpoint's step. (The callers' jobs run 384 steps of ~10 ms on the tiny
    model: seconds are left after the first checkpoint, at step 5; a job that ended first fails
    the `running` check.)"""
    import signal

    from gymloop.store import Store

    eventually(lambda: list(client.fine_tuning.jobs.checkpoints.list(job_id)), 60, "a checkpoint exists", every_s=0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    store = Store(db)
    assert store.jobs.get(None, job_id)["status"] == "running"
    return max(c["step"] for c in store.jobs.checkpoints(job_id)[0])


def _resumed_once_and_counted_once(client, job_id: str, file_id: str, db, killed_step: int) -> None:
    """The job succeeded after resuming once from the checkpoint it was killed after; its file is
    whole, its cost is one ledger row, and its model is listed."""
    from gymloop.store import Store

    done = wait(client, job_id, timeout=300)
    assert done.status == "succeeded", done.error
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job_id, limit=100)]
    resumed = [m for m in messages if m.startswith("Resumed from the checkpoint at step")]
    assert len(resumed) == 1 and int(resumed[0].rsplit(" ", 1)[1]) >= killed_step
    assert client.files.content(file_id).read() == _jsonl(sft_rows(64))             # nothing lost
    rows = [r for r in Store(db).ledger.rows("fine_tuning") if r["run_id"] == job_id]
    assert len(rows) == 1 and rows[0]["trained_tokens"] == done.trained_tokens > 0 and rows[0]["dollars"] > 0
    assert done.fine_tuned_model in [m.id for m in client.models.list()]


def test_kill_9_during_a_job_loses_nothing_and_counts_it_once(tmp_path, tiny_model_dir):
    """The serving process is killed (SIGKILL) mid-job; a restarted server's worker resumes the
    job from its newest checkpoint, the job succeeds, and the ledger holds its cost once."""
    from gymloop.net import free_port

    db, port = tmp_path / "store.db", free_port()
    args = ["serve", "--model", str(tiny_model_dir), "--model-name", "tiny", "--db", str(db), "--api-key", KEY,
            "--port", str(port), "--checkpoint-every", "5"]
    proc = _process(args, port)
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
    try:
        f = upload(client, sft_rows(64))
        job = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method={
            "type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 12, "batch_size": 2}}})
        step = _killed_mid_job(client, job.id, proc, db)
        proc = _process(args, port)
        _resumed_once_and_counted_once(client, job.id, f.id, db, step)
    finally:
        proc.kill()
        proc.wait(10)


def test_worker_processes_run_the_queue_and_take_over_a_killed_ones_job(tmp_path, tiny_model_dir, store_target):
    """`gymloop serve --no-job-worker` queues jobs and runs none; a `gymloop worker` process
    beside it (same model and store) runs them. Killed (SIGKILL) mid-job, its job is taken over
    by the next worker from the newest checkpoint, succeeds once, and the server serves the model.
    On SQLite and on PostgreSQL (conftest's store_target)."""
    import socket

    from gymloop.net import free_port
    from gymloop.store import Store

    db, port = store_target, free_port()
    same = ["--model", str(tiny_model_dir), "--model-name", "tiny", "--db", db, "--jobs-dir", str(tmp_path / "jobs")]
    server = _process(["serve", *same, "--api-key", KEY, "--port", str(port), "--no-job-worker"], port)
    worker = None
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
    try:
        f = upload(client, sft_rows(64))
        job = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method={
            "type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 12, "batch_size": 2}}})
        # the server runs no worker of its own (it says so), so the job waits for one
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").json()["job_worker"] is False
        assert client.fine_tuning.jobs.retrieve(job.id).status == "queued"
        worker = _process(["worker", *same, "--checkpoint-every", "5"])
        assert wait(client, job.id, statuses=("running", "succeeded", "failed"), timeout=60).status == "running"
        assert Store(db).jobs.get(None, job.id)["worker"] == f"{socket.gethostname()}:{worker.pid}"
        step = _killed_mid_job(client, job.id, worker, db)
        worker = _process(["worker", *same, "--checkpoint-every", "5"])
        _resumed_once_and_counted_once(client, job.id, f.id, db, step)
        assert Store(db).jobs.get(None, job.id)["worker"] == f"{socket.gethostname()}:{worker.pid}"
        answer = client.chat.completions.create(model=client.fine_tuning.jobs.retrieve(job.id).fine_tuned_model,
                                                messages=[{"role": "user", "content": "a"}], max_tokens=2)
        assert answer.choices[0].message.content is not None
    finally:
        for proc in (server, worker):
            if proc is not None:
                proc.kill()
                proc.wait(10)


def test_graders_run_through_the_client(client):
    """string_check, text_similarity, python (in the sandbox), multi with a formula; a grader
    that fails reports its error, never a reward of 0 passed off as a grade."""
    run = client.fine_tuning.alpha.graders.run
    check = {"type": "string_check", "name": "eq", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
             "operation": "eq"}
    assert run(grader=check, model_sample="42", item={"answer": "42"}).reward == 1.0
    assert run(grader=check, model_sample="41", item={"answer": "42"}).reward == 0.0
    like = {**check, "operation": "ilike", "reference": "QUICK"}
    assert run(grader=like, model_sample="the quick fox").reward == 1.0
    fuzzy = {"type": "text_similarity", "name": "f", "input": "{{sample.output_text}}", "reference": "{{item.ref}}",
             "evaluation_metric": "fuzzy_match"}
    r = run(grader=fuzzy, model_sample="kitten", item={"ref": "sitting"})
    # rapidfuzz's ratio: 1 - indel distance / total length; LCS "ittn" = 4, distance 6 + 7 - 8 = 5
    assert r.reward == pytest.approx(1 - 5 / 13, abs=1e-6)
    same = {**fuzzy, "evaluation_metric": "bleu"}
    assert run(grader=same, model_sample="the cat sat on the mat", item={"ref": "the cat sat on the mat"}).reward == 1.0
    rouge = {**fuzzy, "evaluation_metric": "rouge_l"}
    # LCS of "the cat sat on mat" and "the cat on the mat" is "the cat on mat": P = R = 4/5, F = 4/5
    r = run(grader=rouge, model_sample="the cat sat on mat", item={"ref": "the cat on the mat"})
    assert r.reward == pytest.approx(0.8, abs=1e-6)
    py = {"type": "python", "name": "len", "source": "def grade(sample, item):\n"
          "    return min(1.0, len(sample['output_text']) / item['n'])\n"}
    assert run(grader=py, model_sample="abc", item={"n": 6}).reward == 0.5
    boom = {**py, "source": "def grade(sample, item):\n    raise RuntimeError('no')\n"}
    r = run(grader=boom, model_sample="abc", item={"n": 6})
    assert r.metadata.errors.python_grader_runtime_error and r.reward == 0.0
    escape = {**py, "source": "import os\ndef grade(sample, item):\n    return float(os.path.exists('/etc/shadow'))\n"}
    assert run(grader=escape, model_sample="x", item={}).reward == 0.0         # the sandbox sees no host files
    multi = {"type": "multi", "name": "m", "graders": {"a": check, "b": py}, "calculate_output": "0.5 * a + 0.5 * b"}
    r = run(grader=multi, model_sample="42", item={"answer": "42", "n": 4})
    assert r.reward == pytest.approx(0.75) and r.sub_rewards == {"a": 1.0, "b": 0.5}
    evil = {**multi, "calculate_output": "__import__('os').system('true')"}
    r = run(grader=evil, model_sample="42", item={"answer": "42", "n": 4})
    assert r.metadata.errors.formula_parse_error and r.reward == 0.0
    missing = run(grader=check, model_sample="42", item={})
    assert missing.metadata.errors.invalid_variable_error


def test_score_model_graders_ask_a_served_model(client):
    """The served model answers the rendered prompt; its number is the score, mapped from range."""
    run = client.fine_tuning.alpha.graders.run
    prompt = [{"role": "user", "content": "{{item.q}}"}]
    asked = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "3+4="}], max_tokens=16,
                                           temperature=0).choices[0].message.content
    grader = {"type": "score_model", "name": "judge", "model": "tiny", "input": prompt, "range": [0, 9],
              "sampling_params": {"temperature": 0}}
    r = run(grader=grader, model_sample="x", item={"q": "3+4="})
    numbers = __import__("re").findall(r"-?\d+(?:\.\d+)?", asked)
    if numbers and 0 <= float(numbers[0]) <= 9:
        assert r.reward == pytest.approx(float(numbers[0]) / 9) and not r.metadata.errors.api_model_grader_parse_error
    else:       # the tiny model's reply holds no score: an error, not a 0
        assert r.metadata.errors.api_model_grader_parse_error and r.reward == 0.0
    r = run(grader={**grader, "model": "ft:nope"}, model_sample="x", item={"q": "1"})
    assert r.metadata.errors.api_model_grader_server_error and "ft:nope" in r.metadata.errors.api_model_grader_server_error_details


def test_graders_validate(client):
    ok = {"type": "multi", "name": "m", "calculate_output": "min(a, 1)", "graders": {
        "a": {"type": "python", "name": "p", "source": "def grade(sample, item):\n    return 1.0\n"}}}
    assert client.fine_tuning.alpha.graders.validate(grader=ok).grader.type == "multi"
    for bad, match in (({**ok, "calculate_output": "a ** 2"}, "calculate_output"),
                       ({"type": "python", "name": "p", "source": "def grade(:"}, "does not parse"),
                       ({"type": "python", "name": "p", "source": "x = 1"}, "define grade"),
                       ({"type": "score_model", "name": "s", "model": "gpt-17",
                         "input": [{"role": "user", "content": "x"}]}, "not served"),
                       ({"type": "string_check", "name": "s", "input": "a", "reference": "b", "operation": "match"},
                        "operation"),
                       ({"type": "nope"}, "grader")):
        with pytest.raises(Exception, match=match):
            client.fine_tuning.alpha.graders.validate(grader=bad)
    # a model the server does not have is a 404 model_not_found, as for any request naming one,
    # also inside a multi grader
    import openai
    unserved = {"type": "score_model", "name": "s", "model": "gpt-17", "input": [{"role": "user", "content": "x"}]}
    for grader in (unserved, {**ok, "graders": {"a": unserved}}):
        with pytest.raises(openai.NotFoundError) as err:
            client.fine_tuning.alpha.graders.validate(grader=grader)
        assert err.value.status_code == 404 and err.value.code == "model_not_found"


def test_traces_export_as_training_files(server, client, capsys, tmp_path):
    """Production answers with verifier feedback -> sft / dpo / rft files the API accepts."""
    import httpx

    from gymloop.cli import main
    from gymloop.finetune.formats import parse

    base = server["base"]
    for i, (reward, temp) in enumerate([(1.0, 0.0), (0.0, 1.5), (1.0, 0.0)]):
        r = httpx.post(base + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                       json={"model": "tiny", "messages": [{"role": "user", "content": "2+2="}], "max_tokens": 3,
                             "temperature": temp, "seed": i})
        tid = r.headers["x-gymloop-trace-id"]
        httpx.post(base + "/v1/feedback", headers={"Authorization": f"Bearer {KEY}"},
                   json={"trace_id": tid, "reward": reward, "task": {"env": "arith", "task_id": "t:2+2"}})
    db = server["app"].state.services.store.url
    files = {}
    for fmt in ("sft", "dpo", "rft"):
        out = tmp_path / f"{fmt}.jsonl"
        assert main(["traces", "export", "--db", str(db), "--format", fmt, "--out", str(out)]) == 0
        files[fmt] = out.read_bytes()
        assert '"examples"' in capsys.readouterr().err
    sft = parse(files["sft"])
    assert sft.kind == "supervised" and len(sft.rows) >= 2
    assert all(r["messages"][-1]["role"] == "assistant" for r in sft.rows)
    # no pair when the served model happened to answer the same each time (an empty file)
    dpo_rows = parse(files["dpo"]).rows if files["dpo"].strip() else []
    rft_rows = parse(files["rft"]).rows
    assert parse(files["rft"]).kind == "reinforcement"
    assert any(r.get("task_id") == "t:2+2" for r in rft_rows)
    assert len(dpo_rows) <= 1                 # one prompt: at most one pair (its best vs its worst answer)
    # and the API takes the exported file as a job's training file
    f = upload(client, files["sft"])
    assert f.status == "processed"


def test_dpo_export_pairs_the_best_and_the_worst_answer_of_a_task():
    from gymloop.finetune.export import export
    from gymloop.finetune.formats import parse

    def trace(answer, reward, task="a:1"):
        return {"request": {"messages": [{"role": "user", "content": "q"}]}, "reward": reward, "env": "arith",
                "env_version": None, "task_id": task,
                "response": {"choices": [{"message": {"role": "assistant", "content": answer}}]}}

    traces = [trace("good", 1.0), trace("meh", 0.5), trace("bad", 0.0), trace("same", 1.0, "a:2"),
              trace("same", 0.0, "a:2"), trace("only", 1.0, "a:3")]
    rows = parse(export(traces, "dpo")).rows
    assert [(r["preferred_output"][0]["content"], r["non_preferred_output"][0]["content"]) for r in rows] == \
        [("good", "bad")]                   # a:2's answers are the same text; a:3 has one answer
    assert [r["messages"][-1]["content"] for r in parse(export(traces, "sft")).rows] == ["good", "same", "only"]
    assert len(parse(export(traces, "rft")).rows) == 3          # one per task
    with pytest.raises(ValueError, match="unknown export format"):
        export(traces, "kto")
