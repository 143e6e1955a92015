"""Routing replay end to end: TorchEngine records, the agent loop keeps, collate pads, and the
learner replays the sampler's experts (frlab.model.routing_replay: an expert flip between
sampler and learner would move the token ratio far more than the trust region allows)."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from helpers.learner import learner_module
from helpers.models import policy_of

from envs.toy import TOY_ENVS
from frlab.data.batch import RolloutBatch, Trajectory, TrajectoryError, collate
from frlab.defaults import agent_loop_config, sampling_params, torch_engine
from frlab.learner.module import FlashReinforceModule
from frlab.model.lm_logprobs import sequence_logprobs
from frlab.model.policy import tiny_config
from frlab.model.routing_replay import moe_routers, record_routing, replay_routing
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.agent_loop import run_episode
from frlab.rollout.torch.engine import TorchEngine

TOK = build_toy_tokenizer()
VOCAB, NUM_EXPERTS, TOP_K, EPISODES = 64, 8, 2, 4
OBJECTIVE_CFG = {
    "baseline": "batch_mean",
    "trust_region": "sequence_bernoulli_kl",
    "aggregation": "sample_mean",
    "token_filter": "none",
    "sequence_bernoulli_kl": {"delta": 0.05},
}
OPTIM_CFG = {"lr": 1e-3, "grad_clip": 1.0}


def tiny_moe(seed: int = 0) -> torch.nn.Module:
    """tiny_config("qwen3_moe") with random routers (HF inits them to zero: all ties)."""
    cfg = tiny_config(
        "qwen3_moe", vocab_size=VOCAB, num_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K
    )
    model = policy_of(config=cfg, seed=seed, attn_implementation="eager").eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for router in moe_routers(model):
            router.weight.copy_(torch.randn(router.weight.shape, generator=gen) * 0.5)
    return model


async def _episodes(engine: TorchEngine) -> list[Trajectory]:
    """Concurrent multi-turn episodes (batched waves, rows leaving early, re-prefills)."""
    env_cls = TOY_ENVS["toy_multi"]
    runs = []
    for i in range(EPISODES):
        env = env_cls()
        task = env_cls.task_sampler().sample(random.Random(i))
        max_new = 2 + 2 * i  # rows finish at different decode steps
        cfg = agent_loop_config(
            max_turns=2, max_len=60, sampling=sampling_params(max_new_tokens=max_new)
        )
        runs.append(run_episode(engine, env, task, TOK, cfg, prompt_id=i))
    return list(await asyncio.gather(*runs))


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_moe()


@pytest.fixture(scope="module")
def trajectories(model) -> list[Trajectory]:
    with torch_engine(model, seed=3, max_batch_size=8, record_routing=True) as engine:
        return asyncio.run(_episodes(engine))


def test_trajectory_routing_is_each_positions_own_experts(model, trajectories) -> None:
    """Per position, the recorded experts equal those of an unbatched forward of the sequence
    (so prefill padding, decode steps and row re-indexing were attributed correctly)."""
    assert any(len(tr.turn_boundaries) == 2 for tr in trajectories)
    assert len({len(tr.token_ids) for tr in trajectories}) > 1
    for tr in trajectories:
        n = len(tr.token_ids)
        assert tr.routing is not None and tr.routing.dtype == torch.int16
        assert tuple(tr.routing.shape) == (n - 1, 2, TOP_K)
        with torch.no_grad(), record_routing(model) as rec:
            model(input_ids=torch.tensor([tr.token_ids[:-1]]))
        expected = rec.indices()[0]
        assert torch.equal(tr.routing.sort(-1).values, expected.sort(-1).values)


def test_replayed_learner_logprobs_equal_the_samplers(model, trajectories) -> None:
    """The learner's sequence_logprobs over the collated batch, replaying the recorded routing,
    give back the engine's behaviour log-probs on every action token (same weights, T = 1)."""
    batch = collate(trajectories)
    assert batch.routing is not None
    assert tuple(batch.routing.shape) == (*batch.input_ids.shape, 2, TOP_K)
    learner = tiny_moe()  # same seed: same weights, a separate module like the learner's
    with torch.no_grad(), replay_routing(learner, batch.routing):
        log_probs, _ = sequence_logprobs(
            learner,
            batch.input_ids,
            batch.attention_mask,
            batch.position_ids,
            action_mask=batch.action_mask,
        )
    gap = (log_probs - batch.behavior_log_probs)[batch.action_mask].abs().max()
    assert float(gap) < 1e-5
    wrong = batch.routing.roll(1, dims=1)  # misattributed positions change the log-probs
    with torch.no_grad(), replay_routing(learner, wrong):
        shifted, _ = sequence_logprobs(
            learner,
            batch.input_ids,
            batch.attention_mask,
            batch.position_ids,
            action_mask=batch.action_mask,
        )
    assert float((shifted - batch.behavior_log_probs)[batch.action_mask].abs().max()) > 1e-3


def test_engine_without_recording_returns_no_routing(model) -> None:
    with torch_engine(model, seed=0) as engine:
        gen = asyncio.run(engine.generate([1, 2, 3], sampling_params(max_new_tokens=2)))
    assert gen.routing is None


def test_engine_refuses_recording_on_a_dense_model() -> None:
    dense = policy_of(config=tiny_config("qwen2", vocab_size=VOCAB), seed=0)
    with pytest.raises(ValueError, match="record_routing"):
        torch_engine(dense, record_routing=True)


def test_batch_routing_survives_select_trim_to(trajectories) -> None:
    batch = collate(trajectories)
    n0 = len(trajectories[0].token_ids) - 1
    assert torch.equal(batch.routing[0, :n0], trajectories[0].routing)
    halves = [batch.select(slice(0, 2)), batch.select(slice(2, None))]
    assert torch.equal(torch.cat([h.routing for h in halves]), batch.routing)
    short = batch.select(torch.tensor([0])).trim()
    assert short.routing.shape[1] == short.input_ids.shape[1] == n0 + 1
    assert torch.equal(short.to("cpu").routing, batch.routing[:1, : n0 + 1])
    plain = collate([_without_routing(tr) for tr in trajectories])
    assert plain.routing is None and "routing" not in plain.tensor_fields()
    assert plain.trim().select(slice(0, 1)).routing is None


def _without_routing(tr: Trajectory) -> Trajectory:
    return Trajectory(**{**tr.__dict__, "routing": None})


def test_bad_routing_is_refused_naming_the_field(trajectories) -> None:
    tr = trajectories[0]
    with pytest.raises(TrajectoryError, match="Trajectory.routing"):
        Trajectory(**{**tr.__dict__, "routing": tr.routing[:-2]})
    with pytest.raises(TrajectoryError, match="Trajectory.routing"):
        Trajectory(**{**tr.__dict__, "routing": tr.routing.float()})
    with pytest.raises(ValueError, match="Trajectory.routing"):
        collate([tr, _without_routing(trajectories[1])])


def _module(policy: torch.nn.Module, replay: bool, pack: bool = True) -> FlashReinforceModule:
    model_cfg = {"config": None, "routing_replay": replay}
    return learner_module(
        model_cfg,
        OBJECTIVE_CFG,
        OPTIM_CFG,
        batch_size=EPISODES,
        micro_batch_size=2,
        pack_sequences=pack,
        policy=policy,
    )


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_learner_step_replays_in_forward_and_backward(trajectories, pack: bool) -> None:
    """The module's micro-batches run forward and backward under the recorded routing (packed
    into one row with the tokens, or padded): gradients equal a hand-made padded replayed
    forward/backward, and the routers are patched while backward runs."""
    batch = collate(trajectories)
    module = _module(tiny_moe(), replay=True, pack=pack)
    module._check_batch(batch, world=1)
    routers = moe_routers(module.policy)
    patched_in_backward = []

    def backward(loss: torch.Tensor) -> None:
        patched_in_backward.append(all("forward" in r.__dict__ for r in routers))
        loss.backward()

    module.manual_backward = backward  # type: ignore[method-assign]
    mb = batch.select(slice(0, 2))
    advantages = torch.tensor([0.5, -0.5])
    kwargs = {"num_sequences": EPISODES, "num_tokens": int(batch.action_mask.sum())}
    module._accumulate(
        mb, advantages, kwargs["num_tokens"], timings={"logprob": 0.0, "backward": 0.0}
    )
    assert patched_in_backward == [True]
    assert not any("forward" in r.__dict__ for r in routers)
    got = [p.grad.clone() for p in module.policy.parameters() if p.grad is not None]

    reference = tiny_moe()
    trimmed = mb.trim()
    with replay_routing(reference, trimmed.routing):
        log_probs, _ = sequence_logprobs(
            reference,
            trimmed.input_ids,
            trimmed.attention_mask,
            trimmed.position_ids,
            action_mask=trimmed.action_mask,
        )
        loss, _ = module.objective(
            log_probs,
            trimmed.behavior_log_probs.to(log_probs.dtype),
            advantages,
            trimmed.action_mask,
            entropies=None,
            failures=trimmed.failures,
            **kwargs,
        )
        loss.backward()
    want = [p.grad for p in reference.parameters() if p.grad is not None]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_learner_refuses_batches_without_routing_and_dense_policies(trajectories) -> None:
    module = _module(tiny_moe(), replay=True)
    plain = collate([_without_routing(tr) for tr in trajectories])
    with pytest.raises(ValueError, match="routing_replay"):
        module._check_batch(plain, world=1)
    dense = policy_of(config=tiny_config("qwen2", vocab_size=VOCAB), seed=0)
    with pytest.raises(ValueError, match="routing_replay"):
        _module(dense, replay=True)
    _module(dense, replay=False)._check_batch(plain, world=1)  # off: nothing needed


def test_preflight_refuses_routing_replay_with_vllm() -> None:
    from hydra.core.global_hydra import GlobalHydra

    from frlab.config.compose import compose
    from frlab.config.errors import ConfigError
    from frlab.config.preflight import preflight

    try:
        with pytest.raises(ConfigError) as info:
            preflight(compose(["rollout/engine=vllm", "model.routing_replay=true"]))
        assert info.value.key == "model.routing_replay"
        assert "rollout/engine=torch" in str(info.value)
    finally:
        GlobalHydra.instance().clear()


def test_batch_routing_field_default_keeps_old_constructors() -> None:
    fields = collate([Trajectory([1, 2], [False, True], [0.0, -0.5], [-1, 0], 1.0, prompt_id=0)])
    assert isinstance(fields, RolloutBatch) and fields.routing is None
