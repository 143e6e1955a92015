"""The toy tokenizer: tiny vocabulary, lossless round trip on its alphabet, chat template."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from frlab.model.toy_tokenizer import ALPHABET, build_toy_tokenizer


def test_vocabulary_fits_the_toy_model() -> None:
    tok = build_toy_tokenizer()
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert len(tok) <= 64
    ids = {tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}
    assert None not in ids and len(ids) == 4
    assert tok.eos_token == "<|end|>"


def test_round_trip_is_character_level_and_lowercases() -> None:
    tok = build_toy_tokenizer()
    text = "Key 7? yes: (a+b)=c.\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text.lower()
    assert tok.unk_token_id not in tok.encode(ALPHABET, add_special_tokens=False)
    assert tok.encode("é", add_special_tokens=False) == [tok.unk_token_id]


def test_chat_template_and_special_tokens() -> None:
    tok = build_toy_tokenizer()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|system|>be brief<|end|><|user|>hi<|end|><|assistant|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|system|>") and ids[
        -1
    ] == tok.convert_tokens_to_ids("<|assistant|>")
    assert tok.decode(ids, skip_special_tokens=True) == "be briefhi"


def test_cached_but_independent_copies() -> None:
    a, b = build_toy_tokenizer(), build_toy_tokenizer()
    a.chat_template = "changed"
    assert b.chat_template != "changed" and build_toy_tokenizer().chat_template != "changed"
