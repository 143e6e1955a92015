"""A tiny character-level tokenizer with a chat template, built locally (no network).

CPU runs and tests need a real `PreTrainedTokenizerFast` (chat template, special tokens,
encode/decode) whose vocabulary fits the tiny toy models (vocab_size 64). Text is lowercased
and split into single characters; characters outside the alphabet map to `<unk>`. The chat
template renders each message as `<|role|>content<|end|>` and the generation prompt as
`<|assistant|>`; `<|end|>` is also the eos token, so the policy ends its turn by sampling it.
"""

from __future__ import annotations

import copy
import functools

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<|end|>", "<unk>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, *ROLE_TOKENS)
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz .,:;?!'-+=*/()<>\n"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def _vocab() -> dict[str, int]:
    tokens = [*SPECIAL_TOKENS, *ALPHABET]
    if len(set(tokens)) != len(tokens):
        raise AssertionError("toy tokenizer alphabet has duplicates")
    return {tok: i for i, tok in enumerate(tokens)}


@functools.lru_cache(maxsize=1)
def _build() -> PreTrainedTokenizerFast:
    core = Tokenizer(models.WordLevel(vocab=_vocab(), unk_token=UNK))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
        padding_side="left",
        model_max_length=4096,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_toy_tokenizer() -> PreTrainedTokenizerFast:
    """The toy tokenizer (61 tokens: fits vocab_size 64); built once per process, returned as a
    copy."""
    return copy.deepcopy(_build())
