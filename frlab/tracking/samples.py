"""`TrajectorySamples`: write a few trajectories of each learner batch to `samples.jsonl`.

Metrics say how a run goes; samples say what the policy actually sees and writes. Every
`every_n_steps` optimizer steps the first `rows` trajectories of the batch are appended as
JSON lines: step, row, reward, the prompt (the tokens before the first policy token: the chat
template applied by the agent loop) and the rest of the trajectory (policy and observation
tokens), as token ids and, when the rollout pool has a tokenizer, as text decoded with special
tokens kept (so the template's markers are visible). Each line is flushed as it is written.
On resume, lines of steps past the restored step (written after the last checkpoint, before a
crash) are dropped, so every step appears once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from frlab.errors import ConfigError

SAMPLES_FILE = "samples.jsonl"


class TrajectorySamples(Callback):
    """Append the first `rows` trajectories of every `every_n_steps`-th batch to `path`."""

    def __init__(self, path: str, rows: int = 1, every_n_steps: int = 1) -> None:
        if int(rows) < 1:
            raise ConfigError("callbacks.samples.rows", f"must be >= 1, got {rows}")
        if int(every_n_steps) < 1:
            raise ConfigError(
                "callbacks.samples.every_n_steps", f"must be >= 1, got {every_n_steps}"
            )
        self.path = Path(path)
        self.rows = int(rows)
        self.every_n_steps = int(every_n_steps)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Drop lines past the restored step (atomic rewrite; nothing to do on a fresh run)."""
        if not trainer.is_global_zero or not self.path.is_file():
            return
        step = int(trainer.global_step)
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if _step_of(line) is not None and _step_of(line) <= step]
        if len(kept) != len(lines):
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(kept), encoding="utf-8")
            os.replace(tmp, self.path)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = int(trainer.global_step)
        if not trainer.is_global_zero or step % self.every_n_steps != 0:
            return
        tokenizer = _pool_tokenizer(trainer)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            for row in range(min(self.rows, int(batch.input_ids.shape[0]))):
                record = {"step": step, "row": row, **sample_record(batch, row, tokenizer)}
                out.write(json.dumps(record) + "\n")
                out.flush()


def sample_record(batch: Any, row: int, tokenizer: Any = None) -> dict[str, Any]:
    """Reward, prompt/completion ids (and text when `tokenizer` is given) of one batch row."""
    valid = batch.attention_mask[row].bool()
    ids = batch.input_ids[row][valid].tolist()
    action = batch.action_mask[row][valid].tolist()
    start = action.index(True) if True in action else len(ids)
    record: dict[str, Any] = {
        "reward": float(batch.rewards[row]),
        "policy_tokens": int(sum(action)),
        "prompt_ids": ids[:start],
        "completion_ids": ids[start:],
    }
    if tokenizer is not None:
        record["prompt"] = tokenizer.decode(ids[:start], skip_special_tokens=False)
        record["completion"] = tokenizer.decode(ids[start:], skip_special_tokens=False)
    return record


def _step_of(line: str) -> int | None:
    """The step of one samples.jsonl line (None for a torn or foreign line)."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def _pool_tokenizer(trainer: Any) -> Any:
    """The rollout pool's tokenizer (None when the trainer has no rollout DataModule)."""
    datamodule = getattr(trainer, "datamodule", None)
    return getattr(getattr(datamodule, "pool", None), "tokenizer", None)
