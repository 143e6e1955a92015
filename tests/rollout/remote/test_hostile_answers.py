"""A server's answer is input, never trusted: each kind of bad answer is refused for its
request, counted by the rollout pool (`requeued_by_reason`: a malformed answer is the engine's
fault, so the prompt runs again), and never reaches a batch.

A vLLM-like fake server (helpers.nccl) answers the first generation request with a bad body,
then honestly; the pool (RolloutPool over RemoteEngine, no retries) must requeue that prompt
(`engine`), drop none, name the cause in its log, and hand out a batch of honest
trajectories only."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from helpers.fleet import remote_engine
from helpers.models import policy_of
from helpers.nccl import FakeVllmServer
from helpers.pool import pool_settings

from envs.base import Env, StepResult, TaskSampler
from frlab.defaults import agent_loop_config, sampling_params
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.pool import RolloutPool
from frlab.rollout.remote import limits
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.fleet import Server, ServerFault
from frlab.rollout.remote.resubmit import token_versions

WEIGHTS = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}
VOCAB, MAX_NEW = 64, 2
HONEST = [7, 8]


def answer(tokens: list[int], log_probs: list[float], **choice: Any) -> dict[str, Any]:
    """A completions answer as vLLM shapes it, with `choice` fields replaced."""
    body = proto.completion_response(
        "fake", [1], tokens, log_probs, [0] * len(tokens), "length", "r"
    )
    del body["choices"][0][proto.VERSIONS_FIELD]
    del body["choices"][0]["prompt_token_ids"]  # optional: the prompts differ per request
    body["choices"][0].update(choice)
    return body


def padded() -> bytes:
    """An honest-looking answer padded beyond any honest size (the prompts here are short)."""
    text = json.dumps(answer(HONEST, [-0.5, -0.25]))
    return (text[:-1] + " " * limits.answer_bytes(64, MAX_NEW) + "}").encode()


# name -> (bad body, what the refusal says)
BAD = {
    "malformed JSON": (b'{"choices": [', "non-JSON"),
    "token id outside the vocabulary": (
        answer([7, 1000], [-0.5, -0.25]),
        "outside the model's vocabulary",
    ),
    "negative token id": (answer([7, -3], [-0.5, -0.25]), "list of ids"),
    "more tokens than asked for": (answer([7, 8, 9], [-0.5, -0.25, -0.1]), "the request allowed 2"),
    "a version the server did not prove": (
        answer(HONEST, [-0.5, -0.25], **{proto.VERSIONS_FIELD: [99, 99]}),
        "answered token versions",
    ),
    "a body larger than any honest answer": (padded(), "of any honest answer"),
    "a non-finite log-prob": (answer(HONEST, [-0.5, float("nan")]), "not a log-probability"),
    "a positive log-prob": (answer(HONEST, [-0.5, 0.25]), "not a log-probability"),
}


class OnceHostile(FakeVllmServer):
    """Answers its first generation request with `bad`, every later one honestly."""

    def __init__(self, bad: Any) -> None:
        super().__init__(n_workers=1)
        self.bad, self.generations = bad, 0

    def post(self, path: str, body: dict[str, Any]) -> Any:
        if path == proto.COMPLETIONS:
            self.generations += 1
            if self.generations == 1:
                return self.bad
        return super().post(path, body)


class Tasks(TaskSampler):
    def sample(self, rng: random.Random) -> dict[str, Any]:
        return {"question": f"q{rng.randrange(5)}"}


class OneTurn(Env):
    """One turn, reward 1: what the episode holds is only the server's answer."""

    @classmethod
    def task_sampler(cls, **kwargs: Any) -> TaskSampler:
        return Tasks()

    def reset(self, task: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": task["question"]}]

    def step(self, action_text: str) -> StepResult:
        return StepResult(None, 1.0, True, {})


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_answer_is_refused_its_prompt_requeued_and_never_trained_on(
    case: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad, says = BAD[case]
    server = OnceHostile(bad)
    engine = remote_engine(
        [server.url],
        snapshot_dir=str(tmp_path),
        request_timeout_s=5.0,
        max_retries=0,
        probe_interval_s=0.02,
        startup_timeout_s=5.0,
        initial_weights=WEIGHTS,
        weight_update="drain",
        vocab_size=VOCAB,
    )
    loop = agent_loop_config(
        max_turns=1, max_len=32, sampling=sampling_params(max_new_tokens=MAX_NEW)
    )
    pool = RolloutPool(
        engine,
        OneTurn,
        build_toy_tokenizer(),
        loop,
        task_sampler=Tasks(),
        **pool_settings(batch_size=2, max_in_flight=1, max_policy_lag=8, mode="sync", seed=3),
    )
    try:
        with caplog.at_level(logging.WARNING):
            pool.start()
            batch = pool.next_batch(timeout=60)
            stats = pool.stats()
    finally:
        pool.stop()
        server.close()
    assert stats["requeued_by_reason"].get("engine", 0) >= 1, stats["requeued_by_reason"]
    assert stats["failed"] == 0, stats["failed_by_reason"]
    assert stats["engine"]["server_faults"] >= 1 and says in caplog.text, caplog.text[-3000:]
    for traj in batch:  # only honest answers were trained on
        actions = [t for t, m in zip(traj.token_ids, traj.action_mask, strict=True) if m]
        assert actions == HONEST, actions
        assert [
            lp for lp, m in zip(traj.behavior_log_probs, traj.action_mask, strict=True) if m
        ] == [-0.5, -0.25]


def test_a_huge_body_without_a_length_is_refused_without_reading_it_all() -> None:
    """A streamed (chunked) answer is read only up to the bound: the rest is never pulled."""
    pulled = []

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(10_000):
            pulled.append(i)
            yield b" " * 65536

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Stream(chunks()))

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await limits.read_bounded(client, "POST", "http://gpu1/v1/completions", 2**20)

    with pytest.raises(limits.AnswerRefused, match="honest answer"):
        asyncio.run(go())
    assert len(pulled) <= 17  # 1 MiB of 64 KiB chunks, and the one that crossed it


class Stream(httpx.AsyncByteStream):
    def __init__(self, it: AsyncIterator[bytes]) -> None:
        self.it = it

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.it:
            yield chunk


@pytest.mark.parametrize(
    ("headers", "says"),
    [({"content-length": str(2**30)}, "announced"), ({"content-encoding": "gzip"}, "gzip")],
)
def test_an_announced_huge_or_an_encoded_body_is_refused_unread(
    headers: dict[str, str], says: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers.get("accept-encoding") == "identity"
        return httpx.Response(200, headers=headers, stream=Stream(_never()))

    async def go() -> None:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(
            transport=transport, headers={"Accept-Encoding": "identity"}
        ) as client:
            await limits.read_bounded(client, "GET", "http://gpu1/server_info", 2**20)

    with pytest.raises(limits.AnswerRefused, match=says):
        asyncio.run(go())


async def _never() -> AsyncIterator[bytes]:
    raise AssertionError("the body was read")
    yield b""  # pragma: no cover


def test_labels_above_what_a_server_proved_are_refused_unless_it_is_being_verified() -> None:
    """The fleet moved to v1; a server that proved v0 and was then refused (stale) cannot
    label tokens v1; while an update verifies it (unverified) or once it proved v1, it can."""
    done = proto.Completion([7], [-0.5], [1], "length")
    server = Server("http://gpu1", state="stale", version=0)
    with pytest.raises(ServerFault, match="answered token versions"):
        token_versions(server, 0, done, 1, "in_flight")
    for state, version in (("unverified", 0), ("ok", 1)):
        server.state, server.version = state, version
        assert token_versions(server, 0, done, 1, "in_flight") == [1]
    with pytest.raises(ServerFault):  # never above the fleet's own version
        token_versions(server, 0, dataclass_replace(done, [2]), 1, "in_flight")


def dataclass_replace(done: proto.Completion, versions: list[int]) -> proto.Completion:
    import dataclasses

    return dataclasses.replace(done, versions=versions)


def test_the_vocabulary_bound_is_the_policys_embedding_rows() -> None:
    from helpers.serve import TINY_QWEN2

    policy = policy_of(config=dict(TINY_QWEN2), seed=0)
    assert limits.model_vocab_size(policy) == TINY_QWEN2["vocab_size"]
    assert limits.model_vocab_size(object()) is None
