"""Chat rendering: ids, masks and multi-turn continuations."""
from __future__ import annotations

from gymloop.models.chat import build_char_tokenizer


def test_char_tokenizer_round_trip(tok):
    text = "def f(x):\n    return {'a': [1, 2]}  # ok"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) == len(text)


def test_prompt_ids_end_with_generation_prompt(tok):
    ids = tok.prompt_ids([{"role": "user", "content": "1+2="}])
    assert tok.hf.convert_ids_to_tokens(ids) == ["<|user|>", "1", "+", "2", "=", "<|end|>", "<|assistant|>"]
    assert tok.hf.eos_token_id in tok.eos_token_ids


def test_sft_mask_covers_assistant_tokens_only(tok):
    msgs = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"},
            {"role": "user", "content": "x"}, {"role": "assistant", "content": "45"}]
    ids, mask = tok.sft_ids(msgs)
    trained = tok.hf.convert_ids_to_tokens([i for i, m in zip(ids, mask) if m])
    assert trained == ["3", "<|end|>", "4", "5", "<|end|>"]


def test_continuation_ids_append_observation(tok):
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "call"}]
    obs = [{"role": "tool", "content": "42"}]
    cont = tok.continuation_ids(history, obs)
    # a tool's result is wrapped by the one tool format (models/toolcalls.py)
    assert tok.decode(cont, skip_special_tokens=False) == "<|tool|><tool_response>42</tool_response><|end|><|assistant|>"


def test_padding_side_is_saved(tmp_path):
    from transformers import AutoTokenizer

    build_char_tokenizer().save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).padding_side == "left"


def test_nano_tokenizer_keeps_digits_single_and_shortens_tool_calls(tok):
    from gymloop.envs import make_env, play
    from gymloop.bases.nano import nano_tokenizer

    nano = nano_tokenizer()
    text = "def f(x):\n    return {'a': [12, 345]}  # ok, MixedCase"
    assert nano.decode(nano.encode(text)) == text
    # every digit is a token of its own, as in Llama's tokenizer: arithmetic sees each digit
    digits = [t for t in nano.hf.convert_ids_to_tokens(nano.encode("907+1234=")) if any(c.isdigit() for c in t)]
    assert digits == list("9071234")
    env = make_env("tools", version=1)
    task = env.sample_tasks(1, "heldout", 0)[0]
    msgs, score = play(env, task, env.gold_turns(task))
    ids, mask = nano.sft_ids(msgs, tools=env.tools(task))
    chars, _ = tok.sft_ids(msgs, tools=env.tools(task))
    assert score.reward == 1.0 and nano.decode(ids, skip_special_tokens=False) == tok.decode(chars, skip_special_tokens=False)
    assert len(ids) * 3 < len(chars)          # sub-words: the episode is over 3x shorter
    # multi-turn continuations still append exactly (the rollout never re-tokenizes the model's text)
    cont = nano.continuation_ids(msgs[:-2], msgs[-2:-1], tools=env.tools(task))
    assert nano.decode(cont, skip_special_tokens=False).startswith("<|tool|>")
    assert nano_tokenizer().hf.get_vocab() == nano.hf.get_vocab()      # deterministic
