"""Prompt token ids from chat messages, with the environment's system-prompt setting.

`template_ids(tokenizer, messages, system_prompt)` applies the tokenizer's chat template with
the generation prompt. `system_prompt` (the environment's `system_prompt`, envs.base):

- `default`: the messages as they are; a template that injects a default system turn when
  the conversation has none keeps doing so (SmolLM2's adds 20 tokens, "You are a helpful AI
  assistant named SmolLM, trained by Hugging Face", to every prompt);
- `none`: no system turn at all, also not the template's default. Templates have no switch
  for this, so the conversation is rendered with a sentinel system turn and that turn's text
  (as the template renders it alone) is cut from the front; a beginning-of-sequence token
  that opens the conversation rather than each turn (Llama-3's `<|begin_of_text|>`) is kept.
  A template that does not render a system turn on its own (one that merges it into the
  first user turn) is refused with a ValueError;
- any other text: the system turn is that text (it replaces a system message of the env).

The rendered text is tokenized with `add_special_tokens=False`, as `apply_chat_template` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT, NONE = "default", "none"
_SENTINEL = "FRLABSYSTEMSENTINEL"


def with_system_prompt(
    messages: list[dict[str, str]], system_prompt: str = DEFAULT
) -> list[dict[str, str]]:
    """The messages with the system setting applied (`none` drops every system message; the
    template's own default is removed later, by `template_ids`)."""
    if system_prompt == DEFAULT:
        return list(messages)
    rest = [m for m in messages if m.get("role") != "system"]
    if system_prompt == NONE:
        return rest
    return [{"role": "system", "content": system_prompt}, *rest]


def _render(tokenizer: Any, messages: list[dict[str, str]], generation: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False)


def render_without_system(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The chat template's text for `messages` with no system turn at all (see above)."""
    convo = with_system_prompt(messages, NONE)
    system = [{"role": "system", "content": _SENTINEL}]
    full, alone = _render(tokenizer, system + convo, True), _render(tokenizer, system, False)
    at = alone.find(_SENTINEL)
    if at < 0 or not full.startswith(alone):
        raise ValueError(
            "system_prompt=none: this chat template does not render a system turn on its own, "
            "so it cannot be removed; use system_prompt=default or a text"
        )
    rest = full[len(alone) :]
    bos = getattr(tokenizer, "bos_token", None)
    if isinstance(bos, str) and bos and alone[:at].startswith(bos) and not rest.startswith(bos):
        rest = bos + rest  # a conversation-level BOS, not part of the system turn
    return rest


def template_ids(
    tokenizer: Any, messages: list[dict[str, str]], system_prompt: str = DEFAULT
) -> list[int]:
    """Token ids of the chat template applied to `messages` (with the generation prompt) under
    the `system_prompt` setting."""
    if system_prompt == NONE:
        text = render_without_system(tokenizer, list(messages))
        return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
    convo = with_system_prompt(list(messages), system_prompt)
    out = tokenizer.apply_chat_template(convo, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if isinstance(out, Mapping) else out
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    return [int(t) for t in ids]
