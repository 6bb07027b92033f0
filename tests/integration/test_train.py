"""Training: RL learns an easy task, checkpoints round-trip, configs fail clearly, CLI runs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from gymloop.models.checkpoint import load_model, save_model
from gymloop.config import ConfigError, TrainConfig, load_config
from gymloop.engine import NativeEngine, SamplingParams
from gymloop.envs import REGISTRY, Score, Task  # noqa: F401
from gymloop.rollout.episodes import collect
from gymloop.algorithms import PolicyLoss, advantages_for
from gymloop.trainer.trainer import Trainer, rollouts_to_batch
from gymloop.trainer.objectives import PolicyObjective

from conftest import DigitEnv, digit_cfg, digit_loop_cfg, tiny_llama, use_env


def test_short_rl_run_learns_easy_task(tok):
    torch.manual_seed(0)
    model = tiny_llama(tok.vocab_size, seed=3)
    engine = NativeEngine(model, tok.pad_token_id)
    trainer = Trainer(model, lr=3e-2, warmup_steps=0)
    env = DigitEnv()
    rewards = []
    for step in range(60):
        tasks = env.sample_tasks(8, "train", step)
        rolls, _ = collect(engine, tok, env, tasks, 8, SamplingParams(max_new_tokens=1, seed=step))
        rewards.append(sum(r.reward for r in rolls) / len(rolls))
        adv = advantages_for(rolls, 8, "grpo", drop_zero_signal=True)
        if adv.rollouts:
            trainer.step(rollouts_to_batch(adv.rollouts, tok.pad_token_id), PolicyObjective(PolicyLoss(), adv.advantages))
        engine.load_weights(model.state_dict(), version=step + 1)
        if sum(rewards[-3:]) / 3 >= 0.9:
            break
    assert rewards[0] < 0.5
    assert sum(rewards[-3:]) / 3 >= 0.9, rewards


def test_infrastructure_errors_are_excluded_not_zero(tok, model):
    class Broken(DigitEnv):
        def verify(self, task, messages):
            if task.id.endswith(":0"):
                raise RuntimeError("sandbox crashed")
            return super().verify(task, messages)

    engine = NativeEngine(model, tok.pad_token_id)
    rolls, stats = collect(engine, tok, Broken(), Broken().sample_tasks(2, "train", 0), 4,
                           SamplingParams(max_new_tokens=1, seed=0))
    assert stats.errors == 4
    assert all(not r.ok and "sandbox crashed" in r.score.error for r in rolls[:4])
    adv = advantages_for(rolls, 4, "grpo", drop_zero_signal=False)
    assert all(r.ok for r in adv.rollouts) and len(adv.rollouts) == 4


def test_episodes_stay_within_the_models_context(tok, model):
    """A prompt longer than the model's positions is an error (excluded from training), never a
    crash; a prompt near the limit gets only the tokens that still fit."""
    context = model.config.max_position_embeddings
    text = lambda k: " ".join(["12+34="] * k)  # noqa: E731
    k = 1
    while len(tok.prompt_ids([{"role": "user", "content": text(k + 1)}])) <= context - 3:
        k += 1
    near = [{"role": "user", "content": text(k)}]

    class Long(DigitEnv):
        def sample_tasks(self, n, split, seed):
            return [Task(id="long", env=self.name, answer=0, prompt=({"role": "user", "content": text(10 * k)},)),
                    Task(id="near", env=self.name, answer=0, prompt=tuple(near))]

    engine = NativeEngine(model, tok.pad_token_id)
    env = Long()
    rolls, stats = collect(engine, tok, env, env.sample_tasks(2, "train", 0), 2,
                           SamplingParams(max_new_tokens=16, seed=0))
    too_long, fitting = rolls[:2], rolls[2:]
    assert len(too_long[0].prompt_ids) > context and stats.errors == 2
    assert all(not r.ok and "does not fit the model's context" in r.score.error and not r.token_ids for r in too_long)
    for r in fitting:
        assert r.ok and 1 <= len(r.token_ids) < 16 and len(r.prompt_ids) + len(r.token_ids) <= context
    adv = advantages_for(rolls, 2, "grpo", drop_zero_signal=False)
    assert all(r.ok for r in adv.rollouts) and len(adv.rollouts) == 2


def test_checkpoint_round_trip_gives_identical_logits(tok, tmp_path):
    model = tiny_llama(tok.vocab_size, seed=5)
    trainer = Trainer(model, lr=1e-3)
    ids = torch.tensor([tok.prompt_ids([{"role": "user", "content": "12+34="}])])
    loss = model(input_ids=ids).logits.square().mean()
    trainer._apply(loss)
    save_model(model, tok, tmp_path / "ckpt")
    trainer.save_state(tmp_path / "ckpt")
    again, tok2 = load_model(tmp_path / "ckpt")
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits)
    assert tok2.encode("12+34=") == tok.encode("12+34=")
    t2 = Trainer(again, lr=1e-3)
    t2.load_state(tmp_path / "ckpt")
    assert t2.step_count == 1
    assert torch.equal(t2.opt.state_dict()["state"][0]["exp_avg"], trainer.opt.state_dict()["state"][0]["exp_avg"])


def test_load_model_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        load_model(tmp_path)


def write(path, data):
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


@pytest.mark.parametrize("data,needle", [
    ({"grpo": {"stepz": 3}}, "grpo.stepz: unknown field"),
    ({"grpo": {"group_size": 1}}, "grpo.group_size"),
    ({"sampling": {"temperature": -1}}, "sampling.temperature"),
    ({"env": {"name": "nope"}}, "unknown environment 'nope'"),
    ({"env": {"options": {"ops": "/"}}}, "ops"),
    ({"grpo": {"loss_agg": "sum"}}, "grpo.loss_agg"),
    ({"grpo": {"lr_schedule": "linear"}}, "grpo.lr_schedule"),
    ({"name": "bad name"}, "name"),
    ({"eval": {"tasks": 0}, "stop_at_pass1": 0.5}, "stop_at_pass1 stops on a held-out score"),
    ("[1, 2", "not valid YAML"),
    ("- a\n- b\n", "must hold a mapping"),
])
def test_bad_config_is_a_clear_error(tmp_path, data, needle):
    with pytest.raises(ConfigError, match="invalid config|YAML|mapping") as exc:
        load_config(write(tmp_path / "c.yaml", data))
    assert needle in str(exc.value)


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    from gymloop.trainer.optim import lr_factor

    const = [lr_factor(s, warmup_steps=4, decay_steps=None, min_ratio=0.1) for s in range(12)]
    assert const[:5] == [0.2, 0.4, 0.6, 0.8, 1.0] and set(const[4:]) == {1.0}
    cos = [lr_factor(s, warmup_steps=4, decay_steps=12, min_ratio=0.1) for s in range(16)]
    assert cos[:4] == const[:4] and cos[4] == 1.0
    assert all(a > b for a, b in zip(cos[4:12], cos[5:13]))          # strictly down to the last step
    assert cos[12] == pytest.approx(0.1) and cos[15] == pytest.approx(0.1)
    assert cos[8] == pytest.approx(0.55)                               # half way: the mean of 1 and 0.1


@pytest.mark.parametrize("max_norm", [1e-3, 1e3])         # clipping every step, and never
def test_a_fused_optimizer_clips_inside_its_step_as_clip_grad_norm_does(tok, max_norm):
    """optimizer_step folds clipping into a fused AdamW's update (its grad_scale): the same
    parameters and gradient norms as clip_grad_norm_ then the unfused AdamW, step after step."""
    from gymloop.trainer.optim import optimizer_step

    runs = []
    for fused in (False, True):
        model = tiny_llama(tok.vocab_size, seed=2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        ids = torch.randint(3, tok.vocab_size, (4, 9), generator=torch.Generator().manual_seed(0))
        norms = [float(optimizer_step(model, opt, sched, model(input_ids=ids, labels=ids).loss, max_norm))
                 for _ in range(4)]
        assert not hasattr(opt, "grad_scale")                          # nothing left on the optimizer
        runs.append((norms, [p.detach().clone() for p in model.parameters()]))
    (n1, p1), (n2, p2) = runs
    assert n1 == pytest.approx(n2, rel=1e-4)
    assert (min(n1) > max_norm) == (max_norm < 1)
    for a, b in zip(p1, p2):
        assert torch.allclose(a, b, atol=1e-5)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.yaml")


def test_cli_bad_config_exits_2_with_message(tmp_path, capsys):
    from gymloop.cli import main

    assert main(["train", str(write(tmp_path / "c.yaml", {"grpo": {"lr": "fast"}}))]) == 2
    err = capsys.readouterr().err
    assert "grpo.lr" in err and "error" in err


def test_cli_train_and_eval_smoke(tmp_path, tiny_model_dir, capsys):
    """`gymloop train` with a tiny budget writes a complete run directory."""
    from gymloop.cli import main

    cfg = {"model": str(tiny_model_dir), "run_dir": str(tmp_path / "runs"), "name": "smoke",
           "sampling": {"max_new_tokens": 4},
           "grpo": {"steps": 3, "prompts_per_step": 4, "group_size": 4, "drop_zero_signal": False},
           "eval": {"tasks": 20, "every": 2, "ks": [2], "samples": 2, "max_new_tokens": 4}}
    assert main(["train", str(write(tmp_path / "c.yaml", cfg)), "--quiet"]) == 0
    run = next((tmp_path / "runs").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["heldout_tasks"] == 20
    assert set(summary["phase_seconds"]) >= {"generation", "training", "evaluation", "verification"}
    assert summary["tokens_generated"] > 0 and "2" in {str(k) for k in summary["final"]["pass_at_k"]}
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]
    assert TrainConfig.model_validate(yaml.safe_load((run / "config.yaml").read_text())).grpo.steps == 3
    load_model(run / "checkpoint")
    assert "held-out pass@1" in capsys.readouterr().out
    assert main(["eval", "--model", str(run / "checkpoint"), "--tasks", "20", "--k", "1,2", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["tasks"] == 20 and set(res["pass_at_k"]) == {"1", "2"}


def test_cli_demo_chapters(capsys):
    from gymloop.cli import build_parser

    p = build_parser()
    assert p.parse_args(["demo"]).only is None                      # both chapters
    assert p.parse_args(["demo", "--only", "loop"]).only == "loop"
    with pytest.raises(SystemExit):
        p.parse_args(["demo", "--only", "story"])
    assert "invalid choice: 'story'" in capsys.readouterr().err


def test_cli_pretrain_smoke(tmp_path, capsys):
    from gymloop.cli import main

    assert main(["pretrain", "--steps", "3", "--cache-dir", str(tmp_path), "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 3 and (tmp_path / "models").exists()
    # cached: a second call does not pre-train again (the directory is reused untouched)
    stamp = (next((tmp_path / "models").iterdir()) / "model.safetensors").stat().st_mtime_ns
    assert main(["pretrain", "--steps", "3", "--cache-dir", str(tmp_path), "--quiet"]) == 0
    assert (next((tmp_path / "models").iterdir()) / "model.safetensors").stat().st_mtime_ns == stamp


def test_pass_at_k_by_hand():
    from gymloop.rollout.evaluate import pass_at_k

    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)   # 1 - C(3,2)/C(4,2)
    with pytest.raises(ValueError):
        pass_at_k(1, 0, 2)


def test_registry_lists_arith():
    assert "arith" in REGISTRY.names()


@pytest.mark.parametrize("collector", ["process", "thread"])
def test_async_training_learns_with_bounded_staleness(tmp_path, tiny_model_dir, digit_env, collector):
    from gymloop.orchestrator.train import train

    s = train(digit_cfg(tmp_path, tiny_model_dir, max_staleness=1, collector=collector), progress=False,
              echo=lambda m: None)
    records = [json.loads(x) for x in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    train_recs = [r for r in records if r["kind"] == "train"]
    assert len(train_recs) == 40 and max(r["staleness"] for r in train_recs) <= 1
    assert sum(r["reward"] for r in train_recs[-5:]) / 5 >= 0.8
    assert s["final"]["pass1"] >= 0.9 and "rollout_wait" in s["phase_seconds"]
    assert s["steps"] == 40
    # generation overlapped training: its tokens are priced on the collector's own seconds
    assert s["economics"]["cost_per_1m_generated_tokens"] > 0


def test_sync_training_is_deterministic(tmp_path, tiny_model_dir, digit_env):
    from gymloop.orchestrator.train import train

    runs = [train(digit_cfg(tmp_path / str(i), tiny_model_dir, steps=5), progress=False, echo=lambda m: None)
            for i in range(2)]
    rewards = [[json.loads(x)["reward"] for x in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()
                if json.loads(x)["kind"] == "train"] for s in runs]
    assert rewards[0] == rewards[1] and all(r["staleness"] == 0 for r in [
        json.loads(x) for x in (Path(runs[0]["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        if r["kind"] == "train")


def test_a_bfloat16_engine_trains_and_its_mismatch_is_measured(tmp_path, tiny_model_dir, digit_env):
    """engine_dtype bfloat16: rollouts and evaluations generate in bfloat16 while the trainer stays
    float32, so the behaviour log-probs differ from the trainer's (a float32 engine's equal them),
    and the run still learns; a loop's gate evaluates in the loop's engine dtype."""
    from gymloop.orchestrator.train import train

    def run(cfg) -> tuple[dict, list[dict]]:
        s = train(cfg, progress=False, echo=lambda m: None)
        recs = [json.loads(x) for x in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        return s, [r for r in recs if r["kind"] == "train"]

    def behaviour_kl(recs: list[dict]) -> float:
        return max(r.get("approx_kl_behaviour", 0.0) for r in recs)    # absent: a step without signal

    cfg = digit_cfg(tmp_path / "bf16", tiny_model_dir)
    cfg.engine_dtype = "bfloat16"
    s, recs = run(cfg)
    assert sum(r["reward"] for r in recs[-5:]) / 5 >= 0.8 and s["final"]["pass1"] >= 0.9
    exact = run(digit_cfg(tmp_path / "fp32", tiny_model_dir, steps=5))[1]
    assert any("approx_kl_behaviour" in r for r in exact)                 # measured, not absent
    assert behaviour_kl(recs) > 1e-6 > behaviour_kl(exact)
    assert digit_loop_cfg(tmp_path, tiny_model_dir, engine_dtype="bfloat16").gate_run().engine_dtype == "bfloat16"


def test_a_run_with_no_held_out_tasks_trains_without_evaluating(tmp_path, tiny_model_dir, digit_env):
    from gymloop.cli import before_after_table
    from gymloop.orchestrator.train import train

    cfg = digit_cfg(tmp_path, tiny_model_dir, steps=3)
    cfg.eval = cfg.eval.model_copy(update={"tasks": 0, "every": 1, "ks": [2], "samples": 2})
    s = train(cfg, progress=False, echo=lambda m: None)
    kinds = [json.loads(x)["kind"] for x in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert kinds == ["train"] * 3 and s["steps"] == 3
    assert s["base"] is None and s["final"] is None and s["gain_pass1_points"] is None
    assert "evaluation" not in s["phase_seconds"] and s["economics"]["intelligence_per_dollar"] is None
    assert s["economics"]["post_training_dollars"] > 0
    assert "no held-out evaluation" in before_after_table(s)
    assert (Path(s["run_dir"]) / "checkpoint").is_dir()


def test_killed_collector_process_is_an_error_not_a_hang(tmp_path, tiny_model_dir, digit_env):
    import os
    import signal

    from gymloop.engine import SamplingParams
    from gymloop.rollout.sources import ProcessSource
    from conftest import DigitEnv, tiny_llama

    tok_ = __import__("gymloop.models.chat", fromlist=["x"]).ChatTokenizer(
        __import__("gymloop.models.chat", fromlist=["x"]).build_char_tokenizer())
    env = DigitEnv()
    src = ProcessSource(tiny_llama(tok_.vocab_size), tok_, env, lambda s: env.sample_tasks(4, "train", s), 4,
                        lambda s: SamplingParams(max_new_tokens=1, seed=s), 1, max_staleness=1, timeout_s=30)
    try:
        assert len(src.next(1).rollouts) == 16
        os.kill(src._proc.pid, signal.SIGKILL)
        src._proc.join(5)
        with pytest.raises(RuntimeError, match="collector died"):
            for step in range(2, 10):
                src.next(step)
    finally:
        src.close()


@pytest.mark.parametrize("collector", ["process", "thread"])
def test_dead_collector_is_an_error_not_a_hang(tmp_path, tiny_model_dir, monkeypatch, collector):
    from gymloop.orchestrator.train import train

    class Dying(DigitEnv):
        def sample_tasks(self, n, split, seed):
            if split == "train" and seed >= 3:
                raise RuntimeError("environment worker crashed")
            return super().sample_tasks(n, split, seed)

    use_env(monkeypatch, "digit", lambda **kw: Dying())
    with pytest.raises(RuntimeError, match="collector died.*environment worker crashed"):
        train(digit_cfg(tmp_path, tiny_model_dir, max_staleness=1, collector=collector), progress=False,
              echo=lambda m: None)


def test_shared_weights_cost_one_copy_and_never_touch_the_buffer_in_use(tok):
    import copy
    import multiprocessing as mp

    from gymloop.sync.shared import SharedWeights

    trainer_model = tiny_llama(tok.vocab_size, seed=5)          # tied embeddings (tiny_llama default)
    engine = NativeEngine(copy.deepcopy(trainer_model), tok.pad_token_id)
    shared = SharedWeights(trainer_model, mp.get_context("fork"))
    ptrs = lambda b: {t.data_ptr() for t in shared.buffers[b].values()}  # noqa: E731

    def bump(v):
        with torch.no_grad():
            for p in trainer_model.parameters():
                p.add_(0.01 * v)
        return {k: t.clone() for k, t in trainer_model.state_dict().items()}

    v1 = bump(1)
    shared.write(trainer_model, 1)
    shared.read_into(engine)
    got = engine.model.state_dict()
    assert engine.version == 1 and all(torch.equal(got[k], v1[k]) for k in v1)
    in_use = shared.in_use.value
    assert {p.data_ptr() for p in engine.model.parameters()} <= ptrs(in_use)     # bound, not copied
    bump(2)
    shared.write(trainer_model, 2)                                # goes to the other buffer...
    assert shared.published.value == 1 - in_use
    assert all(torch.equal(engine.model.state_dict()[k], v1[k]) for k in v1)   # ...the engine still sees v1
    v3 = bump(3)
    shared.write(trainer_model, 3)                                # still not the buffer in use
    shared.read_into(engine)
    assert engine.version == 3 and all(torch.equal(engine.model.state_dict()[k], v3[k]) for k in v3)
    prompt = tok.prompt_ids([{"role": "user", "content": "2+3="}])
    a = engine.generate([prompt], SamplingParams(max_new_tokens=4, temperature=0.0)).generations[0].token_ids
    b = NativeEngine(trainer_model, tok.pad_token_id).generate([prompt], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert a == b.generations[0].token_ids


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_grpo_with_lora_trains_only_adapters_and_saves_merged_and_adapter(tmp_path, tiny_model_dir, digit_env):
    from gymloop.orchestrator.train import train

    cfg = digit_cfg(tmp_path, tiny_model_dir, lr=1e-1, lora={"rank": 8, "alpha": 32})
    s = train(cfg, progress=False, echo=lambda m: None)
    assert s["final"]["pass1"] >= s["base"]["pass1"] + 0.3, (s["base"], s["final"])
    ckpt = Path(s["run_dir"]) / "checkpoint"
    assert (ckpt / "adapter" / "adapter_config.json").exists() and (ckpt / "train_state.pt").exists()
    base, _ = load_model(tiny_model_dir)
    merged, _ = load_model(ckpt)
    changed = {n for n, p in merged.named_parameters() if not torch.equal(p, dict(base.named_parameters())[n])}
    assert changed and all(any(k in n for k in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj")) for n in changed)
    # continuing: the base and the adapter, with the optimizer's state
    more = digit_cfg(tmp_path, tiny_model_dir, lr=1e-1, lora={"rank": 8, "alpha": 32}, steps=2)
    more = more.model_copy(update={"init_adapter": str(ckpt / "adapter"), "init_trainer_state": str(ckpt)})
    s2 = train(more, progress=False, echo=lambda m: None)
    assert s2["base"]["pass1"] == pytest.approx(s["final"]["pass1"])       # it starts where the first ended


def test_lora_needs_a_synchronous_local_run(tmp_path, tiny_model_dir, digit_env):
    with pytest.raises(ValueError, match="grpo.lora"):
        digit_cfg(tmp_path, tiny_model_dir, lora={"rank": 4}, max_staleness=1)
