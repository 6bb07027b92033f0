"""Chat rendering: messages -> token ids (and the training mask), owned by the tokenizer.

The engine only ever sees token ids; everything that knows about roles, special tokens and
templates lives here. `ChatTokenizer` wraps any Hugging Face tokenizer that has a chat
template; `build_char_tokenizer` makes a character-level tokenizer (tests' tiny models) and
`train_nano_tokenizer` the sub-word (BPE) tokenizer of the `nano` model, both built locally
(no hub access).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from .toolcalls import TemplateSupport, for_template

Message = dict  # OpenAI's: {"role", "content"} (+ "tool_calls" / "tool_call_id")

# Characters of the nano vocabulary: enough for arithmetic, tool calls (JSON) and code.
NANO_ALPHABET = (
    "0123456789"
    "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    " \n\t+-*/=%()[]{}<>.,:;!?'\"_#&|@^~`$\\"
)
NANO_SPECIALS = ("<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
# One special token per role; an assistant turn ends with <|end|>, which is also EOS.
# Tools (OpenAI function schemas) render as one compact system line: name(arg,arg) ...
NANO_CHAT_TEMPLATE = (
    "{% if tools %}<|system|>{% for t in tools %}{% set f = t['function'] if 'function' in t else t %}"
    "{{ f['name'] }}({{ f['parameters']['properties'] | join(',') }}){% if not loop.last %} {% endif %}"
    "{% endfor %}<|end|>{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_char_tokenizer(alphabet: str = NANO_ALPHABET) -> PreTrainedTokenizerFast:
    """A character-level tokenizer with the nano chat template, built locally."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    symbols = list(NANO_SPECIALS) + list(dict.fromkeys(alphabet))
    vocab = {s: i for i, s in enumerate(symbols)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(NANO_SPECIALS))
    return nano_hf_tokenizer(tok)


def nano_hf_tokenizer(tok) -> PreTrainedTokenizerFast:
    """A `tokenizers.Tokenizer` over the nano specials as a Hugging Face tokenizer: pad and EOS
    tokens, left padding, the nano chat template."""
    # padding_side must be given to the constructor: set afterwards it is not saved.
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>", padding_side="left"
    )
    hf.chat_template = NANO_CHAT_TEMPLATE
    return hf


def train_nano_tokenizer(texts: Sequence[str], vocab_size: int = 512,
                         alphabet: str = NANO_ALPHABET) -> PreTrainedTokenizerFast:
    """A BPE tokenizer over the nano alphabet, trained on `texts`, with the nano chat template.

    Sub-words make tool calls 5x shorter than characters (`' "arguments":'` is one token), and
    compute per episode falls with them. Digits stay single tokens, as in Llama's tokenizer:
    arithmetic then sees every digit, and no number is a token of its own. Words keep the space
    before them. Deterministic: the same texts give the same vocabulary.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="merged_with_next"),
        pre_tokenizers.Digits(individual_digits=True),
    ])
    tok.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(NANO_SPECIALS),
                                  initial_alphabet=list(dict.fromkeys(alphabet)), show_progress=False)
    tok.train_from_iterator(list(texts), trainer)
    return nano_hf_tokenizer(tok)


@dataclass
class ChatTokenizer:
    """Renders chat messages to token ids with the model's own chat template."""

    hf: PreTrainedTokenizerBase

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        ids = {self.hf.eos_token_id}
        # Chat models often end a turn with a token other than EOS (e.g. <|im_end|>).
        for name in ("<|im_end|>", "<|end|>", "<|eot_id|>"):
            tid = self.hf.convert_tokens_to_ids(name)
            if isinstance(tid, int) and tid != self.hf.unk_token_id and tid is not None:
                ids.add(tid)
        return tuple(sorted(i for i in ids if i is not None))

    @property
    def pad_token_id(self) -> int:
        pid = self.hf.pad_token_id
        return pid if pid is not None else self.hf.eos_token_id

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True,
               tools: list[dict] | None = None) -> str:
        """OpenAI messages (tool calls and results included) and tool schemas as the prompt text,
        through `toolcalls.for_template`: the one tool format of serving, training and the gym."""
        msgs, tools = for_template(messages, tools, TemplateSupport.of(self.hf.chat_template))
        return self.hf.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=add_generation_prompt,
            **({"tools": tools} if tools else {}),
        )

    def encode(self, text: str) -> list[int]:
        return self.hf(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: Sequence[Message], tools: list[dict] | None = None) -> list[int]:
        """Token ids of `messages` followed by the assistant generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True, tools=tools))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def sft_ids(self, messages: Sequence[Message], tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
        """Ids of a whole conversation and a mask that is 1 on assistant-produced tokens.

        Rendered turn by turn, so the mask is exact for any template whose rendering of a
        prefix is a prefix of the rendering of the whole (true of common chat templates). A turn's
        mask ends at its end-of-turn token: what a template writes after it (ChatML's newline) is
        never generated, so it is not trained on.
        """
        ids: list[int] = []
        mask: list[int] = []
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                prefix = self.encode(self.render(messages[:i], add_generation_prompt=True, tools=tools))
                full = self.encode(self.render(messages[: i + 1], add_generation_prompt=False, tools=tools))
                if full[: len(prefix)] != prefix or prefix[: len(ids)] != ids:
                    raise ValueError("chat template does not render prefixes as prefixes")
                mask += [0] * (len(prefix) - len(ids)) + self.turn_mask(full[len(prefix):])
                ids = full
        rest = self.encode(self.render(messages, add_generation_prompt=False, tools=tools))
        if rest[: len(ids)] != ids:
            raise ValueError("chat template does not render prefixes as prefixes")
        mask += [0] * (len(rest) - len(ids))
        return rest, mask

    def turn_mask(self, turn: Sequence[int]) -> list[int]:
        """1 on an assistant turn's tokens up to and including its first end-of-turn token."""
        ends = [i for i, t in enumerate(turn) if t in self.eos_token_ids]
        n = ends[0] + 1 if ends else len(turn)
        return [1] * n + [0] * (len(turn) - n)

    def continuation_ids(self, history: Sequence[Message], new: Sequence[Message],
                         tools: list[dict] | None = None) -> list[int]:
        """Tokens that render `new` messages after `history` and open the next assistant turn.

        `history` ends with the model's own turn, whose *sampled* ids the rollout keeps; only
        this delta is tokenized, so the model's text is never re-tokenized for training.
        """
        before = self.encode(self.render(history, add_generation_prompt=False, tools=tools))
        after = self.encode(self.render(list(history) + list(new), add_generation_prompt=True, tools=tools))
        if after[: len(before)] != before:
            raise ValueError("chat template does not render prefixes as prefixes")
        return after[len(before):]

