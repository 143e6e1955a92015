"""TorchEngine continuous batching: requests join a running batch as rows finish, log-probs stay
the sampler's own through merges, seeded requests do not depend on their batch, abandoned
requests leave the batch, and weight updates land between decode steps of a running request."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
from helpers.torch_engine import generate_all, recomputed_log_probs, tiny_model

from frlab.defaults import sampling_params, torch_engine
from frlab.rollout.torch import sampling as sampler
from frlab.rollout.torch.engine import TorchEngine


def forward_inputs(engine: TorchEngine) -> list[torch.Tensor]:
    """The input ids of every forward the engine's model runs, appended as they happen."""
    inputs: list[torch.Tensor] = []
    engine.model.register_forward_hook(
        lambda mod, args, kwargs, out: inputs.append(kwargs["input_ids"].clone()),
        with_kwargs=True,
    )
    return inputs


async def submit_together(engine: TorchEngine, prompts, params):
    return await asyncio.gather(*engine.generate_many(list(zip(prompts, params, strict=True))))


PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 12], [4, 4], [30, 31, 32, 33], [9] * 17, [2, 7]]
BUDGETS = [12, 2, 9, 3, 6, 10]


@pytest.mark.parametrize("packed", [True, False])
def test_a_waiting_request_joins_the_running_batch_when_a_row_finishes(packed: bool) -> None:
    model = tiny_model(0)
    engine = torch_engine(model, max_batch_size=2, seed=4, packed_prefill=packed)
    assert engine.packed_prefill is packed
    inputs = forward_inputs(engine)
    params = [sampling_params(max_new_tokens=n, temperature=0.8) for n in BUDGETS]
    with engine:
        results = asyncio.run(submit_together(engine, PROMPTS, params))
    shapes = [tuple(x.shape) for x in inputs]
    prefills = [i for i, (_, t) in enumerate(shapes) if t > 1]  # every prompt has >= 2 ids
    if packed:  # the first two prompts end to end in one row
        assert inputs[0].tolist() == [PROMPTS[0] + PROMPTS[1]]
    else:  # left-padded together
        assert shapes[0] == (2, len(PROMPTS[1]))
    assert max(rows for rows, _ in shapes) <= 2
    # the 12-token request (forwards 0..11) is still decoding when the next ones are admitted
    assert 0 < prefills[1] < BUDGETS[0] and len(prefills) >= 4
    # waves of two (12, 2), (9, 3), (6, 10) would take 12 + 9 + 10 forwards
    assert len(shapes) - len(prefills) < 31 - 3
    for prompt, p, res in zip(PROMPTS, params, results, strict=True):
        assert len(res.token_ids) == p.max_new_tokens
        expected = recomputed_log_probs(model, prompt, res.token_ids, 0.8)
        torch.testing.assert_close(torch.tensor(res.log_probs), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("packed", [True, False])
def test_generate_many_starts_its_requests_in_one_prefill_in_order(packed: bool) -> None:
    engine = torch_engine(tiny_model(1), max_batch_size=8, packed_prefill=packed)
    inputs = forward_inputs(engine)
    params = [sampling_params(max_new_tokens=2)] * 5
    with engine:
        asyncio.run(submit_together(engine, PROMPTS[:5], params))
    if packed:
        assert inputs[0].tolist() == [sum(PROMPTS[:5], [])]
    else:
        width = max(len(p) for p in PROMPTS[:5])
        assert inputs[0].tolist() == [[0] * (width - len(p)) + p for p in PROMPTS[:5]]


def test_recorded_log_prob_is_exactly_the_sampled_distributions() -> None:
    """Bitwise: each recorded value is log_softmax(logits / T)[token] of a row the engine drew."""
    model = tiny_model(2, sharpness=5.0)
    engine = torch_engine(model, max_batch_size=3, seed=0)
    drawn: set[tuple[int, float]] = set()
    logits_seen: list[torch.Tensor] = []
    # one row per request: [b, 1, V] padded or decoding, [1, b, V] packed
    engine.model.register_forward_hook(
        lambda m, a, out: logits_seen.append(out.logits.flatten(0, 1))
    )
    real_draw = sampler.inverse_cdf

    def spy(log_probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        tokens = real_draw(log_probs, u)
        expected = torch.log_softmax(logits_seen[-1].float() / 0.7, dim=-1)
        for row, tok in enumerate(tokens.tolist()):
            drawn.add((tok, float(expected[row, tok])))
        return tokens

    params = [sampling_params(temperature=0.7, max_new_tokens=n) for n in BUDGETS]
    sampler.inverse_cdf = spy
    try:
        with engine:
            results = asyncio.run(submit_together(engine, PROMPTS, params))
    finally:
        sampler.inverse_cdf = real_draw
    for res in results:
        assert set(zip(res.token_ids, res.log_probs, strict=True)) <= drawn


def test_a_seeded_request_samples_the_same_tokens_in_any_batch() -> None:
    model = tiny_model(3, sharpness=2.0)  # flat distributions: different draws differ
    target, seeded = [3, 1, 4, 1, 5], sampling_params(max_new_tokens=10, seed=12345)
    others = [sampling_params(max_new_tokens=n, seed=i) for i, n in enumerate(BUDGETS)]
    with torch_engine(model, max_batch_size=4, seed=0) as engine:
        (alone,) = asyncio.run(submit_together(engine, [target], [seeded]))
        last = asyncio.run(submit_together(engine, [*PROMPTS, target], [*others, seeded]))[-1]
        first = asyncio.run(submit_together(engine, [target, *PROMPTS], [seeded, *others]))[0]
        reseeded = sampling_params(max_new_tokens=10, seed=54321)
        (other_seed,) = asyncio.run(submit_together(engine, [target], [reseeded]))
    assert alone.token_ids == last.token_ids == first.token_ids
    torch.testing.assert_close(torch.tensor(last.log_probs), torch.tensor(alone.log_probs))
    assert other_seed.token_ids != alone.token_ids


def test_an_abandoned_request_leaves_the_batch() -> None:
    engine = torch_engine(tiny_model(4), max_batch_size=1)
    shapes = forward_inputs(engine)  # one entry per forward

    async def run() -> list[int]:
        long = asyncio.ensure_future(engine.generate([1, 2], sampling_params(max_new_tokens=100)))
        deadline = time.monotonic() + 60
        while len(shapes) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        long.cancel()
        short = await engine.generate([3], sampling_params(max_new_tokens=2))
        return short.token_ids

    with engine:
        tokens = asyncio.run(run())
    assert len(tokens) == 2
    assert len(shapes) < 100  # the 100-token request stopped early; one row at a time


def test_update_weights_lands_between_decode_steps_of_a_running_request() -> None:
    old, new = tiny_model(0), tiny_model(11, sharpness=80.0)
    engine = torch_engine(old, seed=5)
    shapes = forward_inputs(engine)  # one entry per forward
    out: list = []
    with engine:
        worker = threading.Thread(
            target=lambda: out.extend(
                asyncio.run(generate_all(engine, [[1, 2]], [sampling_params(max_new_tokens=60)]))
            )
        )
        engine.pause()
        worker.start()
        time.sleep(0.05)
        engine.resume()
        deadline = time.monotonic() + 60
        while len(shapes) < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        engine.update_weights(new.state_dict(), version=7)
        worker.join(timeout=120)
    (res,) = out
    versions = res.versions
    switch = versions.index(7)
    assert 3 <= switch < len(versions)
    assert versions == [0] * switch + [7] * (len(versions) - switch)


@pytest.mark.parametrize("seed", [-1, 2**63, True, 1.5])
def test_bad_seeds_are_refused(seed) -> None:
    with torch_engine(tiny_model(0)) as engine:
        with pytest.raises(ValueError, match="seed"):
            asyncio.run(engine.generate([1], sampling_params(seed=seed)))
