"""AvgAtKEvaluation: exact avg@k from a scripted engine, the step interval (and step 0),
metrics.csv rows."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from frlab.config.arguments import declared_defaults
from frlab.config.schema import EvalSamplingConfig, MathEvalConfig
from frlab.defaults import avg_at_k, sampling_params
from frlab.evaluation.avg_at_k import AvgAtKEvaluation, EngineGenerate
from frlab.evaluation.benchmarks import load_benchmark
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.engine import GenerationResult, SamplingParams
from frlab.tracking.run_files import RunFilesCallback, read_metrics

# Four problems; the engine answers 0 and 1 right, 2 wrong, 3 right on every other call.
ALGEBRA = [
    {"question": "what is 3+4?", "answer": "7"},
    {"question": "what is 2*5?", "answer": "10"},
    {"question": "what is 9-1?", "answer": "8"},
    {"question": "what is 6/2?", "answer": "3"},
]
ARITH = [{"question": "what is 1+1?", "answer": "2"}, {"question": "what is 5+5?", "answer": "10"}]
REPLIES = {
    "what is 3+4?": ["the answer is 7"],
    "what is 2*5?": ["so 2*5 = 10. the answer is 10"],
    "what is 9-1?": ["the answer is 9"],
    "what is 6/2?": ["the answer is 3", "the answer is 4"],
    "what is 1+1?": ["the answer is 2"],
    "what is 5+5?": ["the answer is 10"],
}


class ScriptedEngine:
    """Replies from REPLIES by question (cycling through each list), then eos."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.calls: dict[str, int] = {}
        self.params: list[SamplingParams] = []
        self.threads: set[int] = set()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        await asyncio.sleep(0)
        self.params.append(params)
        self.threads.add(threading.get_ident())
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=True)
        question = next(q for q in REPLIES if q in prompt)
        n = self.calls.get(question, 0)
        self.calls[question] = n + 1
        options = REPLIES[question]
        ids = self.tokenizer.encode(options[n % len(options)], add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        return GenerationResult(ids, [0.0] * len(ids), [0] * len(ids), "stop")


def make_pool(loop: asyncio.AbstractEventLoop | None = None) -> SimpleNamespace:
    tokenizer = build_toy_tokenizer()
    return SimpleNamespace(engine=ScriptedEngine(tokenizer), tokenizer=tokenizer, loop=loop)


class Recorder:
    """Stands in for a logger (`log_metrics`) and for RunFilesCallback (`log_step_metrics`)."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.staged: list[tuple[int | None, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append((step, metrics))

    def log_step_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.staged.append((step, dict(metrics)))


def fake_trainer(step: int, pool: Any, recorder: Recorder, rank_zero: bool = True) -> Any:
    return SimpleNamespace(
        global_step=step,
        is_global_zero=rank_zero,
        loggers=[recorder],
        callbacks=[recorder],
        datamodule=SimpleNamespace(pool=pool),
    )


def test_avg_at_k_is_exact_per_benchmark_and_mean() -> None:
    pool = make_pool()
    cb = avg_at_k({"algebra": ALGEBRA, "arith": ARITH}, k=4, every_n_steps=1, top_p=0.95)
    metrics = cb.evaluate(pool.engine, pool.tokenizer)
    assert metrics == {
        "eval/algebra/avg@4": 0.625,  # (1 + 1 + 0 + 2/4) / 4
        # per-problem accuracies 1, 1, 0, 1/2: squared deviations sum to 0.6875 -> sample
        # variance 0.6875 / 3, standard error sqrt(0.6875 / 3 / 4)
        "eval/algebra/avg@4_se": pytest.approx(math.sqrt(0.6875 / 12), rel=1e-12),
        "eval/arith/avg@4": 1.0,
        "eval/arith/avg@4_se": 0.0,
        "eval/mean/avg@4": 0.8125,
    }
    assert pool.engine.calls == {q: 4 for q in REPLIES}  # every problem asked k times
    eos = pool.tokenizer.eos_token_id
    assert {(p.temperature, p.top_p, p.stop_token_ids) for p in pool.engine.params} == {
        (EvalSamplingConfig().temperature, 0.95, (eos,))  # the declared default, top_p given
    }


def test_limit_keeps_the_first_problems() -> None:
    pool = make_pool()
    cb = avg_at_k({"algebra": ALGEBRA}, k=2, every_n_steps=1, limit=3)
    assert cb.evaluate(pool.engine, pool.tokenizer)["eval/algebra/avg@2"] == pytest.approx(2 / 3)
    assert "what is 6/2?" not in pool.engine.calls


def test_generation_runs_on_the_pools_event_loop() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        pool = make_pool(loop)
        params = sampling_params(max_new_tokens=8)
        generate = EngineGenerate(
            pool.engine, pool.tokenizer, params, loop, timeout_s=60.0, system_prompt="default"
        )
        replies = generate([[{"role": "user", "content": "what is 3+4?"}]] * 2)
        assert replies == ["the answer is 7", "the answer is 7"]
        assert pool.engine.threads == {thread.ident}
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def test_logs_every_n_steps_and_not_at_step_zero_by_default() -> None:
    pool, recorder = make_pool(), Recorder()
    trainer = fake_trainer(0, pool, recorder)
    cb = avg_at_k({"arith": ARITH}, k=1, every_n_steps=3)
    for step in [0, 0, 1, 2, 3, 3, 4, 5, 6, 7]:  # repeats: gradient accumulation micro-batches
        trainer.global_step = step
        cb.on_train_batch_end(trainer, None, None, None, 0)
    assert [s for s, _ in cb.history] == [3, 6]
    expected = {"eval/arith/avg@1": 1.0, "eval/arith/avg@1_se": 0.0, "eval/mean/avg@1": 1.0}
    assert recorder.logged == [(3, expected), (6, expected)]
    assert recorder.staged == [(3, expected), (6, expected)]


def test_at_start_evaluates_at_step_zero_of_a_fresh_run_only() -> None:
    pool, recorder = make_pool(), Recorder()
    trainer = fake_trainer(0, pool, recorder)
    cb = avg_at_k({"arith": ARITH}, k=1, every_n_steps=3, at_start=True)
    cb.on_train_start(trainer, None)
    trainer.global_step = 1
    cb.on_train_batch_end(trainer, None, None, None, 0)  # publishes the finished evaluation
    expected = {"eval/arith/avg@1": 1.0, "eval/arith/avg@1_se": 0.0, "eval/mean/avg@1": 1.0}
    assert cb.history == [(0, expected)] and recorder.logged == [(0, expected)]
    assert recorder.staged == [(0, expected)]  # step 0's row, not step 1's
    for step in (2, 3):
        trainer.global_step = step
        cb.on_train_batch_end(trainer, None, None, None, 0)
    cb.on_train_end(trainer, None)  # publishes the step-3 evaluation
    assert [s for s, _ in cb.history] == [0, 3]
    resumed = avg_at_k({"arith": ARITH}, k=1, every_n_steps=3, at_start=True)
    resumed.on_train_start(fake_trainer(6, pool, Recorder()), None)  # resume: no step-0 eval
    off = avg_at_k({"arith": ARITH}, k=1, every_n_steps=3)
    off.on_train_start(fake_trainer(0, pool, Recorder()), None)
    assert resumed.history == [] and off.history == []
    with pytest.raises(ValueError, match="at_start"):
        avg_at_k({"arith": ARITH}, k=1, every_n_steps=3, at_start="yes")  # type: ignore[arg-type]


def test_other_ranks_do_not_evaluate() -> None:
    pool, recorder = make_pool(), Recorder()
    trainer = fake_trainer(2, pool, recorder, rank_zero=False)
    avg_at_k({"arith": ARITH}, k=1, every_n_steps=2).on_train_batch_end(trainer, None)
    assert recorder.logged == [] and recorder.staged == [] and pool.engine.calls == {}


def test_missing_pool_is_a_clear_error() -> None:
    trainer = SimpleNamespace(global_step=2, is_global_zero=True, datamodule=None)
    cb = avg_at_k({"arith": ARITH}, k=1, every_n_steps=2)
    with pytest.raises(RuntimeError, match="datamodule.pool.engine"):
        cb.on_train_batch_end(trainer, None)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"k": 0}, "k"),
        ({"every_n_steps": 0}, "every_n_steps"),
        ({"every_n_steps": True}, "every_n_steps"),
        ({"limit": 0}, "limit"),
        ({"top_p": 0.0}, "top_p"),
        ({"temperature": 0.0}, "temperature"),
        ({"benchmarks": {}}, "benchmarks"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"benchmarks": {"arith": ARITH}, "k": 1, "every_n_steps": 1}
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        avg_at_k(**args)


def test_benchmark_specs(tmp_path: Path) -> None:
    path = tmp_path / "bench.jsonl"
    path.write_text('{"q": "what is 1+1?", "a": 2}\n{"q": "what is 5+5?", "a": 10}\n')
    spec = {"source": str(path), "question_key": "q", "answer_key": "a"}
    assert [p["answer"] for p in load_benchmark("b", spec, limit=1)] == ["2"]
    assert len(load_benchmark("b", spec, limit=None)) == 2
    with pytest.raises(ValueError, match="benchmarks.b needs a 'source'"):
        load_benchmark("b", {"path": str(path)}, limit=None)
    with pytest.raises(ValueError, match="benchmarks.b must be"):
        load_benchmark("b", 3, limit=None)  # type: ignore[arg-type]


def test_metrics_reach_metrics_csv_in_a_real_lightning_run(tmp_path: Path) -> None:
    import lightning as L
    import torch

    class Dummy(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            loss = ((self.w - 1.0) ** 2).sum()
            self.log("train/loss", loss.detach())
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Data(L.LightningDataModule):
        def __init__(self) -> None:
            super().__init__()
            self.pool = make_pool()

        def train_dataloader(self) -> list[torch.Tensor]:
            return [torch.zeros(1)] * 100

    evaluation = avg_at_k({"algebra": ALGEBRA}, k=2, every_n_steps=2, at_start=True)
    run_files = RunFilesCallback(tmp_path)
    trainer = L.Trainer(
        max_steps=5,
        logger=False,
        callbacks=[evaluation, run_files],
        enable_model_summary=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(Dummy(), datamodule=Data())
    rows = {int(r["step"]): r for r in read_metrics(tmp_path)}
    assert sorted(rows) == [0, 1, 2, 3, 4, 5]  # step 0: the evaluation before training
    assert math.isnan(rows[0].get("train/loss", math.nan))
    assert run_files.summary["steps"] == 5 and run_files.summary["rows"] == 5
    for step in (0, 2, 4):
        assert rows[step]["eval/algebra/avg@2"] == 0.625  # (1 + 1 + 0 + 1/2) / 4
        assert rows[step]["eval/mean/avg@2"] == 0.625
    for step in (1, 3, 5):
        assert math.isnan(rows[step].get("eval/algebra/avg@2", math.nan))


def test_an_evaluation_request_that_hangs_fails_at_its_deadline() -> None:
    class HungEngine:
        async def generate(self, ids, params):
            await asyncio.Event().wait()

    generate = EngineGenerate(
        HungEngine(),
        build_toy_tokenizer(),
        sampling_params(),
        None,
        timeout_s=0.1,
        system_prompt="none",
    )
    with pytest.raises(TimeoutError, match="within 0.1 s"):
        generate([[{"role": "user", "content": "1+1?"}]])


def test_from_config_counts_questions_shared_with_the_training_env(tmp_path) -> None:
    """The eval node carries the training `env` node (nested values as config nodes): the
    evaluation builds the env's dataset to count benchmark questions training also sees."""
    from omegaconf import OmegaConf

    from frlab.rollout.pool.factory import env_factory

    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n')
    env = OmegaConf.create(
        {"_target_": "envs.math.MathEnv", "source": str(data), "options": {}, "holdout": None}
    )
    benchmarks = OmegaConf.create(
        {"mixed": [{"question": "2+2", "answer": "4"}, {"question": "3+3", "answer": "6"}]}
    )
    node = {"benchmarks", "k", "every_n_steps", "sampling", "env", "kind"}
    keys = [f.name for f in dataclasses.fields(MathEvalConfig) if f.name not in node]
    cb = AvgAtKEvaluation.from_config(
        benchmarks=benchmarks,
        sampling=OmegaConf.create(declared_defaults(EvalSamplingConfig, temperature=1.0)),
        env=env,
        env_factory=env_factory,
        k=1,
        every_n_steps=1,
        **declared_defaults(MathEvalConfig, keys),
    )
    assert len(cb.benchmarks["mixed"]) == 2 and cb.overlap == {"mixed": 1}
