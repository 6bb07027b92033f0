"""NativeEngine: log-probs match a full forward pass, padding, stopping, weight swaps."""
from __future__ import annotations

import pytest
import torch

from gymloop.engine import NativeEngine, SamplingParams, sample_next
from gymloop.engine.sampling import left_pad
from gymloop.trainer.logprobs import make_batch, token_logprobs

from conftest import tiny_llama

PROMPTS = [[3, 10, 11, 12], [3, 20, 21, 22, 23, 24, 25, 26], [3, 30]]


def full_forward_logprobs(model, prompt, completion, temperature):
    batch = make_batch([prompt + completion], [[0] * len(prompt) + [1] * len(completion)], None, 0)
    with torch.no_grad():
        lp = token_logprobs(model, batch, temperature)
    return lp[0, len(prompt):]


@pytest.mark.parametrize("backend", ["llama", "hf"])
@pytest.mark.parametrize("kv_heads,model_type", [(4, "llama"), (2, "llama"), (2, "qwen2")])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_full_forward(tok, backend, kv_heads, model_type, temperature):
    model = tiny_llama(tok.vocab_size, kv_heads=kv_heads, model_type=model_type)
    if model_type == "qwen2":  # give the q/k/v biases non-zero values
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    eng = NativeEngine(model, tok.pad_token_id, backend=backend)
    out = eng.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=temperature, seed=1))
    worst = 0.0
    for p, g in zip(PROMPTS, out.generations):
        ref = full_forward_logprobs(model, p, g.token_ids, temperature)
        worst = max(worst, (ref - torch.tensor(g.logprobs)).abs().max().item())
    assert worst <= 1e-4, worst


def test_greedy_matches_hf_generate(tok, model):
    eng = NativeEngine(model, tok.pad_token_id)
    out = eng.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0.0))
    for p, g in zip(PROMPTS, out.generations):
        ref = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None)
        assert g.token_ids == ref[0, len(p):].tolist()


def test_native_and_hf_backends_agree_under_sampling(tok, model):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=7)
    a = NativeEngine(model, tok.pad_token_id, backend="llama").generate(PROMPTS * 4, params)
    b = NativeEngine(model, tok.pad_token_id, backend="hf").generate(PROMPTS * 4, params)
    # HF keeps finished rows and the native path drops them; with no stop token both sample
    # every row at every step from the same generator, so the draws are the same.
    assert [g.token_ids for g in a.generations] == [g.token_ids for g in b.generations]


def test_stop_token_and_length(tok, model):
    eng = NativeEngine(model, tok.pad_token_id)
    free = eng.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=0.0))
    first = free.generations[1].token_ids[2]
    out = eng.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(first,)))
    g = out.generations[1]
    assert g.finish_reason == "stop" and g.token_ids[-1] == first
    assert len(g.token_ids) <= 3
    assert all(len(x.token_ids) == 6 and x.finish_reason == "length"
               for x in free.generations if first not in x.token_ids)
    assert out.generated_tokens == sum(len(x.token_ids) for x in out.generations)


def test_stop_string(tok, model):
    eng = NativeEngine(model, tok.pad_token_id, decode=tok.decode)
    free = eng.generate(PROMPTS[:1], SamplingParams(max_new_tokens=8, temperature=0.0))
    text = tok.decode(free.generations[0].token_ids)
    stop = text[2:4]
    out = eng.generate(PROMPTS[:1], SamplingParams(max_new_tokens=8, temperature=0.0, stop=(stop,)))
    assert out.generations[0].finish_reason == "stop"
    assert tok.decode(out.generations[0].token_ids).endswith(stop)


def test_stop_string_without_tokenizer_is_an_error(tok, model):
    eng = NativeEngine(model, tok.pad_token_id)
    with pytest.raises(ValueError, match="stop strings"):
        eng.generate(PROMPTS, SamplingParams(max_new_tokens=2, stop=("x",)))


def test_copies_of_a_prompt_are_prefilled_once(tok, model):
    """A GRPO group's samples share their prompt: the native backend prefills each distinct
    prompt once; every copy still samples on its own and its log-probs are the model's."""
    eng = NativeEngine(model, tok.pad_token_id, backend="llama")
    rows = []
    prefill = eng.backend._prefill
    eng.backend._prefill = lambda ids, mask: rows.append(len(ids)) or prefill(ids, mask)
    prompts = [PROMPTS[i % 3] for i in range(12)]              # 3 prompts x 4 copies, interleaved
    out = eng.generate(prompts, SamplingParams(max_new_tokens=10, temperature=1.0, seed=3))
    assert rows == [3]
    assert len({tuple(g.token_ids) for g in out.generations}) > 3                 # copies sample apart
    for p, g in zip(prompts, out.generations):
        ref = full_forward_logprobs(model, p, g.token_ids, 1.0)
        assert (ref - torch.tensor(g.logprobs)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cascade_attention_is_attention_over_each_rows_whole_cache(dtype):
    """A decode step reads a prompt's cache once for all its rows: the same as attention over
    each row's prompt and generated keys laid end to end (groups of uneven size, interleaved;
    padded prompts; generated slots not yet written)."""
    from gymloop.engine.llama import cascade_attention, members

    torch.manual_seed(0)
    U, KV, H, P, N, D = 3, 2, 6, 7, 5, 8
    group = torch.tensor([2, 0, 0, 1, 2, 0, 2])                          # B = 7 rows of 3 prompts
    B = len(group)
    member, width = members(group, U)
    assert member.tolist() == [0, 0, 1, 0, 1, 2, 2] and width == 3
    pk, pv = torch.randn(U, KV, P, D), torch.randn(U, KV, P, D)
    pseen = torch.ones(U, P, dtype=torch.bool)
    pseen[1, :3] = False                                                  # a left-padded prompt
    k, v, q = torch.randn(B, KV, N, D), torch.randn(B, KV, N, D), torch.randn(B, H, 1, D)
    seen = torch.zeros(B, N, dtype=torch.bool)
    seen[:, :3] = True
    cast = [t.to(dtype) for t in (q, pk, pv, k, v)]
    got = cascade_attention(cast[0], cast[1], cast[2], pseen, group, member, width, cast[3], cast[4], seen, D ** -0.5)
    keys, values = torch.cat((pk[group], k), 2), torch.cat((pv[group], v), 2)   # [B, KV, P + N, D]
    want = torch.nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=torch.cat((pseen[group], seen), -1)[:, None, None], enable_gqa=True)
    assert got.dtype is dtype and got.shape == want.shape
    assert (got.float() - want).abs().max() < (1e-5 if dtype is torch.float32 else 3e-2)


def test_compaction_changes_nothing(tok, model):
    """Dropping finished rows from the cache must not change any row's output."""
    from gymloop.engine.sampling import run_generation

    eng = NativeEngine(model, tok.pad_token_id)
    probe = eng.generate(PROMPTS * 3, SamplingParams(max_new_tokens=10, temperature=0.0))
    stop = probe.generations[0].token_ids[1]
    params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(stop,))
    eager = run_generation(eng.backend, PROMPTS * 3, params, tok.pad_token_id, None, compact_fraction=0.0)
    never = run_generation(eng.backend, PROMPTS * 3, params, tok.pad_token_id, None, compact_fraction=2.0)
    assert [g.token_ids for g in eager] == [g.token_ids for g in never]
    assert max(abs(a - b) for x, y in zip(eager, never) for a, b in zip(x.logprobs, y.logprobs)) < 1e-5


def test_load_weights_in_place(tok):
    a, b = tiny_llama(tok.vocab_size, seed=0), tiny_llama(tok.vocab_size, seed=1)
    eng = NativeEngine(a, tok.pad_token_id)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    before = eng.generate(PROMPTS, params)
    copied = eng.load_weights(b.state_dict(), version=3)
    assert copied > 0 and eng.version == 3 and eng.model is a
    after = eng.generate(PROMPTS, params)
    expect = NativeEngine(b, tok.pad_token_id).generate(PROMPTS, params)
    assert [g.token_ids for g in after.generations] == [g.token_ids for g in expect.generations]
    assert after.version == 3 and before.version == 0
    # Publishing the engine's own tensors copies nothing.
    assert eng.load_weights(a.state_dict(), version=4) == 0


def test_load_weights_rejects_bad_input(tok, model):
    eng = NativeEngine(model, tok.pad_token_id)
    with pytest.raises(KeyError, match="not a parameter"):
        eng.load_weights({"nope.weight": torch.zeros(1)}, version=1)
    name = "model.norm.weight"
    with pytest.raises(ValueError, match="shape"):
        eng.load_weights({name: torch.zeros(7)}, version=1)


def test_sampling_params_validation():
    for bad in (dict(max_new_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)
    drawn = {sample_next(logits, 1.0, 0.7, gen)[0].item() for _ in range(200)}
    assert drawn == {0, 1}
    tok, lp, _ = sample_next(logits, 0.0, 1.0, None)
    assert tok.item() == 0 and abs(lp.item() - torch.log(torch.tensor(0.5)).item()) < 1e-6


def test_a_drawn_token_follows_the_distribution():
    """engine.sampling.draw: frequencies over 20,000 draws within 5 standard errors of each
    probability; a zero-probability entry (first, middle, last) is never drawn; seeded draws repeat."""
    from gymloop.engine.sampling import draw

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.15, 0.05, 0.0], [0.2, 0.0, 0.2, 0.2, 0.2, 0.0, 0.2]])
    gen = torch.Generator().manual_seed(0)
    n = 20_000
    counts = torch.zeros_like(probs)
    for _ in range(n // 500):
        toks = torch.stack([draw(probs, gen) for _ in range(500)])             # [500, 2]
        for row in range(2):
            counts[row] += torch.bincount(toks[:, row], minlength=probs.shape[1])
    freq = counts / n
    se = (probs * (1 - probs) / n).sqrt()
    assert ((freq - probs).abs() <= 5 * se + 1e-9).all(), freq
    assert (counts[probs == 0] == 0).all()
    assert draw(probs * 3, torch.Generator().manual_seed(1)).tolist() == draw(probs, torch.Generator().manual_seed(1)).tolist()


def test_left_pad_and_empty_prompt(tok, model):
    ids, mask = left_pad([[5, 6], [7]], 0)
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[True, True], [False, True]]
    with pytest.raises(ValueError, match="at least one token"):
        NativeEngine(model, tok.pad_token_id).generate([[]], SamplingParams())


def test_unknown_backend(tok, model):
    with pytest.raises(ValueError, match="unknown engine backend"):
        NativeEngine(model, tok.pad_token_id, backend="vllm")


def test_bfloat16_engine_computes_in_bfloat16_and_leaves_the_model_alone(tok):
    """The cast copies give bfloat16's answer (the log-probs of a float32 forward within
    bfloat16's rounding, not equal: the engine really computes in bfloat16), the model's own
    parameters stay float32 and trainable, and a weight update reaches generation."""
    model = tiny_llama(tok.vocab_size, seed=0)
    eng = NativeEngine(model, tok.pad_token_id, dtype="bfloat16")
    assert eng.backend.dtype is torch.bfloat16 and eng.backend.layers[0][1].dtype is torch.bfloat16
    assert all(p.dtype is torch.float32 and p.requires_grad for p in model.parameters())
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert (eng.backend.lm_head is eng.backend.embed) == tied                # a tied head: one copy
    out = eng.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=1.0, seed=2))
    gaps = [(full_forward_logprobs(model, p, g.token_ids, 1.0) - torch.tensor(g.logprobs)).abs().max().item()
            for p, g in zip(PROMPTS, out.generations)]
    assert 1e-5 < max(gaps) < 0.1, gaps
    # an optimizer step on the shared model, published as a trainer does: the copies are remade
    other = tiny_llama(tok.vocab_size, seed=1)
    with torch.no_grad():
        for p, q in zip(model.parameters(), other.parameters()):
            p.copy_(q)
    assert eng.load_weights(model.state_dict(), version=1) == 0       # nothing copied: the same tensors
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    again = NativeEngine(other, tok.pad_token_id, dtype="bfloat16").generate(PROMPTS, greedy)
    assert [g.token_ids for g in eng.generate(PROMPTS, greedy).generations] == \
        [g.token_ids for g in again.generations]


def test_a_compute_dtype_needs_the_native_backend(tok, model):
    with pytest.raises(ValueError, match="needs the native llama backend"):
        NativeEngine(model, tok.pad_token_id, backend="hf", dtype="bfloat16")
    with pytest.raises(ValueError, match="unknown engine dtype"):
        NativeEngine(model, tok.pad_token_id, dtype="float8")


def test_the_configs_engine_dtypes_are_the_engines():
    import typing

    from gymloop.config import EngineDtype
    from gymloop.engine import ENGINE_DTYPES

    assert set(typing.get_args(EngineDtype)) == set(ENGINE_DTYPES)


def lora_model(tok, seed=0, **options):
    """A tiny Llama with LoRA adapters on every projection, B moved off 0 (so they change the output)."""
    from gymloop.models.lora import wrap

    model = wrap(tiny_llama(tok.vocab_size, seed=seed, kv_heads=2, model_type="qwen2"),
                 {"rank": 4, "alpha": 8, **options})
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    return model.eval()


def test_a_lora_model_generates_natively_as_its_own_forward(tok):
    """The native path takes each projection as base + scaling * B A: its log-probs are those of
    peft's forward, its draws the hf backend's, and an optimizer step on the adapters, published
    as a trainer does (the same tensors: nothing copied), reaches generation."""
    model = lora_model(tok)
    eng = NativeEngine(model, tok.pad_token_id)
    assert eng.backend_name == "llama"
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=3)
    out = eng.generate(PROMPTS * 2, params)
    for p, g in zip(PROMPTS * 2, out.generations):
        ref = full_forward_logprobs(model, p, g.token_ids, 1.0)             # peft's own forward
        assert (ref - torch.tensor(g.logprobs)).abs().max().item() <= 1e-4
    hf = NativeEngine(model, tok.pad_token_id, backend="hf").generate(PROMPTS * 2, params)
    assert [g.token_ids for g in out.generations] == [g.token_ids for g in hf.generations]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    plain = NativeEngine(tiny_llama(tok.vocab_size, seed=0, kv_heads=2, model_type="qwen2"),   # the base alone
                   tok.pad_token_id).generate(PROMPTS, greedy)
    assert [g.token_ids for g in eng.generate(PROMPTS, greedy).generations] != [g.token_ids for g in plain.generations]
    before = eng.generate(PROMPTS, greedy)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_A" in n:
                p.mul_(-2.0)
    assert eng.load_weights(model.state_dict(), version=1) == 0
    after = eng.generate(PROMPTS, greedy)
    assert [g.token_ids for g in after.generations] != [g.token_ids for g in before.generations]
    for p, g in zip(PROMPTS, after.generations):
        assert (full_forward_logprobs(model, p, g.token_ids, 1.0) - torch.tensor(g.logprobs)).abs().max() <= 1e-4


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")     # peft, on adapting the tied head
@pytest.mark.parametrize("options,why", [({"dropout": 0.1}, "dropout"),
                                         ({"target_modules": ["q_proj", "lm_head"]}, "lm_head")])
def test_lora_the_native_path_cannot_compute_runs_in_the_models_forward(tok, options, why):
    from gymloop.engine.llama import supports

    model = lora_model(tok, **options)
    assert why in supports(model)
    eng = NativeEngine(model, tok.pad_token_id)
    assert eng.backend_name == "hf" and why in eng.native_unsupported


def test_vllm_is_started_with_its_devices_preset_then_the_users_flags():
    from pathlib import Path

    from gymloop.engine.vllm import ServerSpec, server_command

    cpu = server_command(Path("py"), ServerSpec("m", "bfloat16", 512, device="cpu", args=("--max-num-seqs", "8")), 1)
    assert "--enforce-eager" in cpu and "--no-enable-chunked-prefill" in cpu
    assert cpu[cpu.index("--dtype") + 1] == "bfloat16" and cpu[-2:] == ["--max-num-seqs", "8"]
    gpu = server_command(Path("py"), ServerSpec("m", gpu_memory=0.45, device="cuda"), 1)
    assert "--enforce-eager" not in gpu and gpu[gpu.index("--gpu-memory-utilization") + 1] == "0.45"
