"""Chat rendering: ids, masks and multi-turn continuations."""
from __future__ import annotations

from gymloop.chat import build_char_tokenizer


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
    assert tok.hf.convert_ids_to_tokens(cont) == ["<|tool|>", "4", "2", "<|end|>", "<|assistant|>"]


def test_padding_side_is_saved(tmp_path):
    from transformers import AutoTokenizer

    build_char_tokenizer().save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).padding_side == "left"
