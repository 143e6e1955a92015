"""`auto` micro-batch budget and checkpointing (frlab.model.auto_memory): chosen from the memory
plan and the device's free memory by the documented rule, explicit values kept, and recorded by
a run (summary.json's plan)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frlab.model.auto_memory import (
    AUTO,
    HEADROOM,
    ROUND,
    LearnerMemory,
    ram,
    resolve_learner_memory,
)
from frlab.model.memory_plan import activation_per_token, head_chunk_bytes, memory_plan
from frlab.model.policy import make_config

SHAPE = {
    "model_type": "qwen2",
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}
GIB = 2**30


def sections(tokens=AUTO, checkpointing=AUTO, batch=64, max_len=2048) -> dict:  # noqa: ANN001
    return {
        "model": {
            "config": SHAPE,
            "dtype": "float32",
            "gradient_checkpointing": checkpointing,
            "lora": None,
            "logprob_chunk_size": 1024,
        },
        "data": {
            "batch_size": batch,
            "micro_batch_size": batch,
            "max_tokens_per_micro_batch": tokens,
        },
        "rollout": {"max_len": max_len, "max_in_flight": 4, "device": "cpu"},
        "trainer": {"precision": "32-true", "devices": 1, "accelerator": "gpu"},
    }


def _fixed(cfg: dict) -> int:
    plan = memory_plan(
        {
            **cfg,
            "model": {**cfg["model"], "gradient_checkpointing": False},
            "data": {**cfg["data"], "max_tokens_per_micro_batch": 1},
        }
    )
    return plan.weights + plan.grads + plan.optimizer + head_chunk_bytes(make_config(SHAPE), 1024)


def test_explicit_values_are_kept_without_a_device() -> None:
    assert resolve_learner_memory(sections(4096, True)) == LearnerMemory(4096, True)
    assert resolve_learner_memory(sections(None, False)) == LearnerMemory(None, False)
    assert resolve_learner_memory(sections(AUTO, True)) is None  # no device to choose for


def test_ample_memory_leaves_checkpointing_off_and_caps_the_budget_at_the_batch() -> None:
    chosen = resolve_learner_memory(sections(), (80 * GIB, 80 * GIB, "cuda:0"))
    assert chosen.gradient_checkpointing is False
    assert chosen.max_tokens_per_micro_batch == 64 * 2048  # the rank's whole batch
    assert "checkpointing off" in chosen.why and "80.0 GiB free on cuda:0" in chosen.why


def test_the_budget_is_what_fits_by_the_rule_in_multiples_of_128() -> None:
    cfg = sections()
    config = make_config(SHAPE)
    per_token = activation_per_token(config, False, 4)
    free = int((_fixed(cfg) + 5000 * per_token) / HEADROOM) + 1  # room for 5,000 tokens
    chosen = resolve_learner_memory(cfg, (free, 2 * free, "cuda:0"))
    assert chosen.gradient_checkpointing is False  # 5,000 >= max_len 2,048
    assert chosen.max_tokens_per_micro_batch == 5000 // ROUND * ROUND == 4992


def test_checkpointing_turns_on_where_a_whole_trajectory_would_not_fit() -> None:
    cfg = sections()
    config = make_config(SHAPE)
    free = int((_fixed(cfg) + 1000 * activation_per_token(config, False, 4)) / HEADROOM)
    chosen = resolve_learner_memory(cfg, (free, free, "cuda:0"))
    assert chosen.gradient_checkpointing is True  # 1,000 < max_len 2,048 without it
    per_token_on = activation_per_token(config, True, 4)
    room = int(free * HEADROOM) - _fixed(cfg)
    assert chosen.max_tokens_per_micro_batch == room // per_token_on // ROUND * ROUND
    explicit = resolve_learner_memory(sections(checkpointing=False), (free, free, "cuda:0"))
    assert explicit.gradient_checkpointing is False  # a user's choice wins
    assert explicit.max_tokens_per_micro_batch < 2048
    assert "below rollout.max_len=2048" in explicit.why


def test_an_in_process_engine_share_comes_off_the_room() -> None:
    device = (60 * GIB, 80 * GIB, "cuda:0")
    alone = resolve_learner_memory(sections(batch=4096), device)
    shared = resolve_learner_memory(sections(batch=4096), device, engine_share=0.5)
    assert shared.max_tokens_per_micro_batch < alone.max_tokens_per_micro_batch
    assert "less 40.0 GiB for the engine" in shared.why


def test_ram_reads_this_machine() -> None:
    available, total, name = ram()
    assert 0 < available <= total and name == "cpu RAM"


@pytest.mark.slow
def test_a_run_records_the_auto_values_it_chose(tmp_path: Path) -> None:
    from frlab import train
    from frlab.config.compose import compose

    cfg = compose(
        [
            f"paths.output_dir={tmp_path}",
            "trainer.max_steps=1",
            "data.batch_size=4",
            "data.micro_batch_size=2",
            "rollout.max_in_flight=4",
            "plots=false",
            "data.max_tokens_per_micro_batch=auto",
            "model.gradient_checkpointing=auto",
            "~callbacks.model_checkpoint",
            "trainer.enable_checkpointing=false",
        ]
    )
    summary = train.run(cfg)
    plan = json.loads((Path(summary["output_dir"]) / "summary.json").read_text())["plan"]
    assert isinstance(plan["data.max_tokens_per_micro_batch"], int)
    assert plan["model.gradient_checkpointing"] is False
    assert "auto from" in plan["learner"] and "cpu RAM" in plan["learner"]
