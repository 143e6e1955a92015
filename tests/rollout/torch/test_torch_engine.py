"""TorchEngine: recorded log-probs are the sampler's own, versions follow update_weights,
batching respects max_batch_size, and the serving thread is joined on shutdown."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from helpers.torch_engine import VOCAB, generate_all, recomputed_log_probs, tiny_model

from frlab.defaults import sampling_params, torch_engine
from frlab.rollout.engine import EngineError
from frlab.rollout.torch.engine import TorchEngine
from frlab.rollout.torch.sampling import sampling_log_probs

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 12], [4], [30, 31, 32, 33]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_log_probs_equal_a_fresh_forward(temperature: float) -> None:
    model = tiny_model(0)
    params = [sampling_params(temperature=temperature, max_new_tokens=n) for n in (9, 4, 12, 6)]
    with torch_engine(model, seed=3) as engine:
        results = asyncio.run(generate_all(engine, PROMPTS, params))
    for prompt, p, res in zip(PROMPTS, params, results, strict=True):
        assert len(res.token_ids) == p.max_new_tokens and res.finish_reason == "length"
        expected = recomputed_log_probs(model, prompt, res.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(res.log_probs), expected, atol=1e-4, rtol=0)
        assert res.versions == [0] * len(res.token_ids)


def test_temperature_changes_the_recorded_distribution() -> None:
    """Guards the test above: log-probs at T=1 differ from those at T=0.7 for the same tokens."""
    model = tiny_model(0)
    with torch_engine(model, seed=3) as engine:
        (res,) = asyncio.run(
            generate_all(engine, [PROMPTS[0]], [sampling_params(temperature=0.7, max_new_tokens=8)])
        )
    at_one = recomputed_log_probs(model, PROMPTS[0], res.token_ids, 1.0)
    assert (at_one - torch.tensor(res.log_probs)).abs().max() > 1e-2


def test_stop_token_ends_the_request_and_is_kept() -> None:
    everything = tuple(range(VOCAB))
    with torch_engine(tiny_model(1)) as engine:
        (res,) = asyncio.run(
            generate_all(
                engine, [[1, 2]], [sampling_params(max_new_tokens=5, stop_token_ids=everything)]
            )
        )
    assert res.finish_reason == "stop" and len(res.token_ids) == 1
    assert res.token_ids[0] in everything


def test_top_k_and_top_p_log_probs_are_of_the_truncated_renormalised_distribution() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    top2 = sampling_log_probs(logits, [sampling_params(top_k=2)])[0]
    assert torch.isinf(top2[2:]).all()
    torch.testing.assert_close(top2[:2], torch.log_softmax(logits[0, :2], dim=-1))
    probs = torch.softmax(logits[0], dim=-1)  # ~[.64, .23, .09, .03, .01]
    nucleus = sampling_log_probs(logits, [sampling_params(top_p=0.8)])[0]  # keeps the first two
    assert torch.isinf(nucleus[2:]).all()
    torch.testing.assert_close(nucleus[:2].exp(), probs[:2] / probs[:2].sum())
    full = sampling_log_probs(logits, [sampling_params(temperature=2.0)])[0]
    torch.testing.assert_close(full, torch.log_softmax(logits[0] / 2.0, dim=-1))


def test_sampled_tokens_stay_inside_top_k() -> None:
    model = tiny_model(2)
    prompt = [7, 8, 9]
    with torch.no_grad():
        allowed = set(
            model(input_ids=torch.tensor([prompt])).logits[0, -1].topk(3).indices.tolist()
        )
    params = [sampling_params(top_k=3, max_new_tokens=1)] * 16
    with torch_engine(model, seed=0) as engine:
        results = asyncio.run(generate_all(engine, [prompt] * 16, params))
    assert {r.token_ids[0] for r in results} <= allowed


def test_engine_keeps_its_own_copy_of_the_weights() -> None:
    model = tiny_model(0)
    snapshot = tiny_model(0)
    with torch_engine(model, seed=1) as engine:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))  # the learner keeps training
        (res,) = asyncio.run(
            generate_all(engine, [PROMPTS[1]], [sampling_params(max_new_tokens=6)])
        )
    expected = recomputed_log_probs(snapshot, PROMPTS[1], res.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(res.log_probs), expected, atol=1e-4, rtol=0)


def test_update_weights_bumps_the_version_and_samples_from_the_new_weights() -> None:
    old, new = tiny_model(0), tiny_model(11, sharpness=80.0)
    prompt = PROMPTS[3]
    with torch_engine(old, seed=5) as engine:
        assert engine.version == 0
        (before,) = asyncio.run(generate_all(engine, [prompt], [sampling_params(max_new_tokens=6)]))
        engine.update_weights(new.state_dict(), version=7)
        assert engine.version == 7
        (after,) = asyncio.run(generate_all(engine, [prompt], [sampling_params(max_new_tokens=6)]))
    assert before.versions == [0] * 6 and after.versions == [7] * 6
    from_new = recomputed_log_probs(new, prompt, after.token_ids, 1.0)
    from_old = recomputed_log_probs(old, prompt, after.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(after.log_probs), from_new, atol=1e-4, rtol=0)
    assert (from_old - torch.tensor(after.log_probs)).abs().max() > 1e-1


def test_update_weights_rejects_mismatched_state_dicts() -> None:
    model = tiny_model(0)
    engine = torch_engine(model)
    state = dict(model.state_dict())
    with pytest.raises(KeyError, match="missing"):
        engine.update_weights({k: v for k, v in state.items() if k != "lm_head.weight"}, 1)
    with pytest.raises(KeyError, match="unknown"):
        engine.update_weights({**state, "extra.weight": torch.zeros(1)}, 1)
    state["lm_head.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="lm_head.weight"):
        engine.update_weights(state, 1)
    with pytest.raises(ValueError, match="version"):
        engine.update_weights(model.state_dict(), -1)
    assert engine.version == 0


def test_batches_never_exceed_max_batch_size() -> None:
    model = tiny_model(0)
    engine = torch_engine(model, max_batch_size=2)
    sizes: list[int] = []
    engine.model.register_forward_hook(
        lambda mod, args, kwargs, out: sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )

    async def run():
        engine.pause()
        tasks = [
            asyncio.create_task(engine.generate([1, 2, i], sampling_params(max_new_tokens=3)))
            for i in range(5)
        ]
        await asyncio.sleep(0.05)
        engine.resume()
        return await asyncio.gather(*tasks)

    engine.start()
    try:
        results = asyncio.run(run())
    finally:
        engine.shutdown()
    assert len(results) == 5 and max(sizes) == 2 and sizes[0] == 2


def test_paused_engine_holds_requests_until_resumed() -> None:
    engine = torch_engine(tiny_model(0))

    async def run():
        engine.pause()
        task = asyncio.create_task(engine.generate([1, 2], sampling_params(max_new_tokens=2)))
        done, _ = await asyncio.wait({task}, timeout=0.2)
        held = not done
        engine.resume()
        return held, await task

    with engine:
        held, res = asyncio.run(run())
    assert held and len(res.token_ids) == 2


def test_shutdown_joins_the_thread_and_fails_waiting_requests() -> None:
    engine = torch_engine(tiny_model(0))
    engine.start()
    assert any(t.name == "frlab-torch-engine" for t in threading.enumerate())

    async def run():
        engine.pause()
        task = asyncio.create_task(engine.generate([1, 2], sampling_params(max_new_tokens=2)))
        await asyncio.sleep(0.05)
        engine.shutdown()
        with pytest.raises(EngineError, match="shut down"):
            await task

    asyncio.run(run())
    assert not any(t.name == "frlab-torch-engine" for t in threading.enumerate())
    with pytest.raises(EngineError, match="start"):
        asyncio.run(engine.generate([1], sampling_params()))


def test_bad_requests_raise_clear_errors() -> None:
    with torch_engine(tiny_model(0)) as engine:
        with pytest.raises(ValueError, match="prompt_token_ids"):
            asyncio.run(engine.generate([], sampling_params()))
        with pytest.raises(ValueError, match="prompt_token_ids"):
            asyncio.run(engine.generate([1, VOCAB], sampling_params()))
        with pytest.raises(ValueError, match="temperature"):
            asyncio.run(engine.generate([1], sampling_params(temperature=0.0)))
    with pytest.raises(ValueError, match="max_batch_size"):
        torch_engine(tiny_model(0), max_batch_size=0)


def test_the_engine_group_builds_a_copy_of_the_policy() -> None:
    """`rollout/engine=torch`: the config node is a partial called with (policy, seed)."""
    from frlab.config.compose import compose, instantiate

    policy = tiny_model(0)
    cfg = compose(["rollout.max_in_flight=5", "rollout.device=cpu"])
    engine = instantiate(cfg.rollout.engine, key="rollout.engine")(policy=policy, seed=1)
    assert isinstance(engine, TorchEngine) and engine.version == 0
    assert engine.max_batch_size == 5 and engine.device == torch.device("cpu")
    assert engine._model is not policy
