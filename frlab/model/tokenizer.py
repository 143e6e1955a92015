"""The run's tokenizer (`model.tokenizer`) and the errors of a model or tokenizer source.

`load_tokenizer(model)` builds the tokenizer of the `model` node: `toy` (the local toy
tokenizer) or a Hugging Face id, folder or `gguf:` source. A source that cannot be loaded, and
a random-init model too small for the tokenizer's vocabulary, are ValueErrors whose text
starts with the config key (the run reports them as config errors).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from frlab.errors import ConfigError

SOURCE_HINT = (
    "a local folder, a Hugging Face id already in the local cache (offline: "
    "HF_HUB_OFFLINE=1), or a gguf: source"
)
WRAPPERS = ("ConfigError", "InstantiationException")  # errors that carry the real one as cause


def build_tokenizer(name: str) -> Any:
    """`toy` -> the local toy tokenizer, else AutoTokenizer (hub id, folder or `gguf:` source,
    frlab.model.gguf), its pad token the end-of-sequence token where it has none."""
    if name == "toy":
        from frlab.model.toy_tokenizer import build_toy_tokenizer

        return build_toy_tokenizer()
    from transformers import AutoTokenizer

    from frlab.model.gguf import resolve_model_source

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source(name))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(model: Mapping[str, Any]) -> Any:
    """The tokenizer of the `model` node, checked against a random-init model's vocabulary."""
    same = model["tokenizer"] == model.get("name_or_path")
    with source_errors(model["tokenizer"], "model.name_or_path" if same else "model.tokenizer"):
        tokenizer = build_tokenizer(model["tokenizer"])
    check_vocab(model, tokenizer)
    return tokenizer


def check_vocab(model: Mapping[str, Any], tokenizer: Any) -> None:
    """A random-init model must embed every token id the tokenizer can produce."""
    vocab = (model.get("config") or {}).get("vocab_size")
    if model.get("name_or_path") is None and isinstance(vocab, int) and len(tokenizer) > vocab:
        raise ConfigError(
            "model.config.vocab_size",
            f"({vocab}) is smaller than the tokenizer's vocabulary ({len(tokenizer)})",
        )


@contextlib.contextmanager
def source_errors(source: Any, key: str) -> Iterator[None]:
    """The "not found / not loadable" errors of a model or tokenizer `source` as a ValueError
    starting with `key`, under the wrappers of whoever built it (a config error, Hydra's
    InstantiationException); a config error of its own goes through as it is."""
    try:
        yield
    except (OSError, ValueError) as exc:
        cause: BaseException = exc
        while type(cause).__name__ in WRAPPERS and cause.__cause__ is not None:
            cause = cause.__cause__
        if source is None or type(cause).__name__ == "ConfigError":
            raise
        if not isinstance(cause, OSError | ValueError):
            raise
        first = (str(cause).splitlines() or [""])[0]
        raise ConfigError(key, f"cannot load {source!r}: {first} (expected {SOURCE_HINT})") from exc
