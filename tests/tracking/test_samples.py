"""`TrajectorySamples`: prompt/completion split, decoding, the JSONL file, step filtering."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from frlab.data.batch import Trajectory, collate
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.tracking.samples import TrajectorySamples, sample_record


def _trajectory(ids: list[int], mask: list[bool], reward: float) -> Trajectory:
    n = len(ids)
    log_probs = [-0.5 if m else 0.0 for m in mask]
    return Trajectory(ids, mask, log_probs, [0] * n, reward, prompt_id=0)


def _batch():
    # row 0: prompt 3 tokens, action 2, observation 1, action 1; row 1 shorter (padded)
    rows = [
        _trajectory([5, 6, 7, 8, 9, 10, 11], [False] * 3 + [True, True, False, True], 1.0),
        _trajectory([5, 12, 13], [False, True, True], 0.0),
    ]
    return collate(rows, pad_token_id=0)


def test_record_splits_at_the_first_policy_token_and_drops_padding() -> None:
    batch = _batch()
    assert sample_record(batch, 0) == {
        "reward": 1.0,
        "policy_tokens": 3,
        "prompt_ids": [5, 6, 7],
        "completion_ids": [8, 9, 10, 11],
    }
    assert sample_record(batch, 1) == {
        "reward": 0.0,
        "policy_tokens": 2,
        "prompt_ids": [5],
        "completion_ids": [12, 13],
    }


def test_record_decodes_with_special_tokens_kept() -> None:
    tok = build_toy_tokenizer()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "parity: 3"}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    reply = tok("7", add_special_tokens=False)["input_ids"]
    traj = _trajectory(prompt_ids + reply, [False] * len(prompt_ids) + [True] * len(reply), 1.0)
    record = sample_record(collate([traj]), 0, tok)
    assert record["prompt"] == tok.decode(prompt_ids, skip_special_tokens=False)
    assert record["completion"] == "7"
    assert record["prompt_ids"] == prompt_ids


def test_callback_appends_the_first_rows_every_n_steps(tmp_path: Path) -> None:
    path = tmp_path / "run" / "samples.jsonl"
    callback = TrajectorySamples(str(path), rows=5, every_n_steps=2)
    batch = _batch()
    for step in (1, 2, 3, 4):
        trainer = SimpleNamespace(global_step=step, is_global_zero=True, datamodule=None)
        callback.on_train_batch_end(trainer, None, None, batch, step - 1)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["row"]) for r in lines] == [(2, 0), (2, 1), (4, 0), (4, 1)]
    assert "prompt" not in lines[0]  # no pool tokenizer: ids only


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"rows": 0}, "rows"), ({"every_n_steps": 0}, "every_n_steps")]
)
def test_bad_settings_name_the_field(tmp_path: Path, kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"callbacks.samples.{field}"):
        TrajectorySamples(str(tmp_path / "s.jsonl"), **kwargs)


def test_a_resume_drops_lines_past_the_restored_step(tmp_path: Path) -> None:
    """Steps written after the last checkpoint, before a crash, would otherwise appear twice."""
    path = tmp_path / "samples.jsonl"
    lines = [json.dumps({"step": s, "row": 0}) + "\n" for s in (1, 2, 3, 4)]
    path.write_text("".join(lines) + '{"step": 5, "ro')  # a torn last line from a kill
    cb = TrajectorySamples(str(path))
    cb.on_train_start(SimpleNamespace(global_step=2, is_global_zero=True), None)
    assert path.read_text() == "".join(lines[:2])
    cb.on_train_start(SimpleNamespace(global_step=2, is_global_zero=True), None)  # idempotent
    assert path.read_text() == "".join(lines[:2])
