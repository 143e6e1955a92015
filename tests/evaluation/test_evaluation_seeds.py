"""Evaluation requests carry seeds derived from (weight version, call, request index): distinct
within a call, the same in a rerun at the same version, different at another version; they
are submitted together with `generate_many`."""

from __future__ import annotations

from typing import Any

from frlab.defaults import sampling_params
from frlab.evaluation.avg_at_k import EngineGenerate
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.engine import Engine, GenerationResult, SamplingParams

TOKENIZER = build_toy_tokenizer()


class SeedRecorder(Engine):
    """Answers eos at once; records each submission's seeds."""

    def __init__(self, version: int) -> None:
        self._version = version
        self.submissions: list[list[int | None]] = []

    @property
    def version(self) -> int:
        return self._version

    def start(self) -> None: ...
    def shutdown(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def update_weights(self, state_dict, version: int) -> None: ...

    async def generate(self, prompt_token_ids, params: SamplingParams) -> GenerationResult:
        return GenerationResult([TOKENIZER.eos_token_id], [0.0], [self._version], "stop")

    def generate_many(self, requests):
        self.submissions.append([params.seed for _, params in requests])
        return super().generate_many(requests)


def seeds(version: int, calls: int = 2) -> list[list[Any]]:
    engine = SeedRecorder(version)
    generate = EngineGenerate(
        engine,
        TOKENIZER,
        sampling_params(max_new_tokens=2),
        None,
        timeout_s=60.0,
        system_prompt="none",
    )
    prompts = [[{"role": "user", "content": f"{i}"}] for i in range(4)]
    for _ in range(calls):
        generate(prompts)
    return engine.submissions


def test_evaluation_seeds_are_distinct_repeatable_and_follow_the_version() -> None:
    first, again, later = seeds(3), seeds(3), seeds(4)
    assert first == again and len(first) == 2 and len(first[0]) == 4
    flat = [s for call in first for s in call]
    assert None not in flat and len(set(flat)) == len(flat)  # per call and per request
    assert not set(flat) & {s for call in later for s in call}
