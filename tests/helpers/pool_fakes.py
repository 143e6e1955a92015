"""Fakes shared by the RolloutPool tests: a fake engine samples instantly; a gated fake
environment blocks each rollout's step until the test opens that task's gate, so the order in
which rollouts finish is chosen by the test. `board` is the fixture of a closed board."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter

import pytest

from envs.base import Env, StepResult
from frlab.defaults import agent_loop_config, sampling_params
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.engine import Engine, EngineError, GenerationResult, SamplingParams
from frlab.rollout.pool import RolloutPool
from helpers.pool import pool_settings

TOKENIZER = build_toy_tokenizer()
LETTERS = [TOKENIZER.convert_tokens_to_ids(c) for c in "abcdefgh"]


class FakeEngine(Engine):
    """Samples 2 random letters + eos at log-prob -1; prompts containing "boom" fail."""

    def __init__(self) -> None:
        self._version = 0
        self.started = self.shut_down = False
        self.calls = 0
        self._rng = random.Random(0)

    @property
    def version(self) -> int:
        return self._version

    def start(self) -> None:
        self.started = True

    def shutdown(self) -> None:
        self.shut_down = True

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams
    ) -> GenerationResult:
        await asyncio.sleep(0)
        self.calls += 1
        if "boom" in TOKENIZER.decode(prompt_token_ids):
            raise EngineError("boom")
        ids = [self._rng.choice(LETTERS), self._rng.choice(LETTERS), TOKENIZER.eos_token_id]
        ids = ids[: params.max_new_tokens]
        return GenerationResult(ids, [-1.0] * len(ids), [self._version] * len(ids), "stop")

    def update_weights(self, state_dict, version: int) -> None:
        self._version = int(version)


class Board:
    """Shared test state: task numbering, per-task gates and behaviours."""

    def __init__(self, open_by_default: bool = False, plan: dict[int, str] | None = None) -> None:
        self.open_by_default, self.plan = open_by_default, dict(plan or {})
        self.lock = threading.Lock()
        self.count = 0
        self.gates: dict[int, threading.Event] = {}
        self.attempts: Counter[int] = Counter()
        self.closed_envs = 0
        self.release = threading.Event()

    def gate(self, n: int) -> threading.Event:
        with self.lock:
            if n not in self.gates:
                self.gates[n] = threading.Event()
                if self.open_by_default:
                    self.gates[n].set()
            return self.gates[n]

    def open(self, *ns: int) -> None:
        for n in ns:
            self.gate(n).set()

    def open_all(self) -> None:
        self.open_by_default = True
        with self.lock:
            gates = list(self.gates.values())
        for g in gates:
            g.set()


class GatedEnv(Env):
    """Task n: reset shows it, step waits for gate n, reward n % 2; `plan` injects failures."""

    def __init__(self, board: Board) -> None:
        self.board = board
        self.n, self.x = -1, -1

    def sample_task(self, rng: random.Random) -> dict:
        with self.board.lock:
            n, self.board.count = self.board.count, self.board.count + 1
        return {"n": n, "x": rng.randrange(1000)}

    def reset(self, task) -> list[dict[str, str]]:
        self.n, self.x = int(task["n"]), int(task["x"])
        kind = self.board.plan.get(self.n, "ok")
        text = {"engine_fail": "boom", "zero": "z" * 80}.get(kind, f"task {self.n}")
        return [{"role": "user", "content": text}]

    def step(self, action_text: str) -> StepResult:
        with self.board.lock:
            self.board.attempts[self.n] += 1
            first = self.board.attempts[self.n] == 1
        kind = self.board.plan.get(self.n, "ok")
        if kind == "env_fail" or (kind == "flaky" and first):
            raise RuntimeError(f"env step failed for task {self.n}")
        if kind == "hang":
            self.board.release.wait()  # until the test ends: never within the deadline
        if not self.board.gate(self.n).wait(timeout=20):
            raise TimeoutError(f"gate {self.n} never opened")
        return StepResult(None, float(self.n % 2), True, {"n": self.n, "x": self.x})

    def close(self) -> None:
        with self.board.lock:
            self.board.closed_envs += 1


def make_pool(board: Board, env_timeout_s: float = 300.0, **kw) -> tuple[RolloutPool, FakeEngine]:
    engine = FakeEngine()
    cfg = agent_loop_config(
        max_turns=1,
        max_len=64,
        sampling=sampling_params(max_new_tokens=4),
        env_timeout_s=env_timeout_s,
    )
    opts = dict(batch_size=2, max_in_flight=4, max_policy_lag=8, num_env_workers=8)
    opts.update(kw)
    tasks = GatedEnv.task_sampler(board=board)  # the default: one instance's sample_task
    pool = RolloutPool(
        engine, lambda: GatedEnv(board), TOKENIZER, cfg, task_sampler=tasks, **pool_settings(**opts)
    )
    return pool, engine


@pytest.fixture
def board():
    b = Board()
    yield b
    b.open_all()


def task_ids(batch) -> list[int]:
    return sorted(t.info["env"]["n"] for t in batch)


def wait_for(pred, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.005)
