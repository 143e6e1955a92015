"""A scripted text engine for environment tests: each turn is the next scripted string,
tokenised, cut to the turn budget and followed by eos (behaviour log-prob -0.5, version 0)."""

from __future__ import annotations

from typing import Any

from frlab.rollout.engine import Engine, GenerationResult, SamplingParams


class ScriptedTextEngine(Engine):
    """Answers each generate call with the next scripted text (token in, token out)."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tok, self.turns = tokenizer, list(turns)

    @property
    def version(self) -> int:
        return 0

    def start(self) -> None: ...
    def shutdown(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def update_weights(self, state_dict, version: int) -> None: ...

    async def generate(self, prompt_token_ids, params: SamplingParams) -> GenerationResult:
        ids = self.tok.encode(self.turns.pop(0), add_special_tokens=False)
        ids = [*ids[: params.max_new_tokens - 1], self.tok.eos_token_id]
        return GenerationResult(ids, [-0.5] * len(ids), [0] * len(ids), "stop")
