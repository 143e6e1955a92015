"""LoRA on a REAL vLLM engine on this CPU (`rollout/engine=vllm` with `model.lora`,
frlab.rollout.vllm.lora): vLLM serves the frozen base plus the learner's peft adapter,
its log-probs equal the learner's recomputation of base + adapter, an adapter-only push lands
(log-probs move to the new adapter's, away from the old and from the base), across an update
in flight the tokens before it are the old adapter's, and a full-weight push is refused."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest
import torch
from helpers.vllm_cpu import REPORT, recompute, save_model, wait_for
from test_engine import PROMPTS, Driver

from frlab.defaults import sampling_params
from frlab.model.lora import adapted_modules, adapter_state_dict, apply_lora
from frlab.rollout.engine import EngineError

pytestmark = pytest.mark.vllm_cpu

LORA = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": ["all-linear"], "adapter": None}


def moved_adapter(policy: Any, seed: int, scale: float = 0.3) -> dict[str, torch.Tensor]:
    """The adapter tensors of `policy` moved by noise (B too: peft starts it at zero)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        n: v + scale * torch.randn(v.shape, generator=gen, dtype=v.dtype)
        for n, v in adapter_state_dict(policy.state_dict()).items()
    }


def with_adapter(policy: Any, adapter: dict[str, torch.Tensor]) -> Any:
    out = copy.deepcopy(policy).eval()
    out.load_state_dict(adapter, strict=False)
    return out


def diffs(model: Any, prompt: list[int], result: Any) -> torch.Tensor:
    return (recompute(model, prompt, result.token_ids) - torch.tensor(result.log_probs)).abs()


@pytest.fixture(scope="module")
def lora_served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from frlab.rollout.vllm.engine import VLLMEngine

    base = save_model(tmp_path_factory.mktemp("vllm_lora") / "toy", seed=0, vocab_size=256)
    policy = apply_lora(copy.deepcopy(base), LORA)
    policy.load_state_dict(moved_adapter(policy, seed=1), strict=False)  # start off the base
    engine = VLLMEngine.for_policy(
        policy,
        seed=0,
        model=None,
        max_model_len=128,
        max_in_flight=8,
        cpu_kv_cache_gib=None,
        weight_update=None,
        engine_args={"dtype": "float32"},
    )
    engine.start()
    driver = Driver(engine)
    yield driver, base, policy.eval()
    driver.close()


def test_vllm_serves_base_plus_adapter_with_the_learners_log_probs(lora_served) -> None:
    driver, base, policy = lora_served
    assert len(adapted_modules(policy)) == 7 * base.config.num_hidden_layers  # all linear
    results = driver.many(PROMPTS[:3], sampling_params(max_new_tokens=24, seed=3))
    worst = max(diffs(policy, p, r).max().item() for p, r in zip(PROMPTS, results, strict=False))
    assert worst < 1e-4, worst
    assert (
        min(diffs(base, p, r).max().item() for p, r in zip(PROMPTS, results, strict=False)) > 1e-2
    )
    REPORT.append(
        f"vLLM CPU LoRA (rank 8, all linear) log-probs vs learner: max |diff| {worst:.2e}"
    )


def test_an_adapter_only_push_lands(lora_served) -> None:
    driver, base, policy = lora_served
    engine = driver.engine
    new = moved_adapter(policy, seed=7)
    version = engine.version + 1
    start = time.monotonic()
    engine.update_weights(new, version)
    took = time.monotonic() - start
    updated = with_adapter(policy, new)
    results = driver.many(PROMPTS[:3], sampling_params(max_new_tokens=16, seed=4))
    for prompt, result in zip(PROMPTS, results, strict=False):
        assert set(result.versions) == {version}
        assert diffs(updated, prompt, result).max() < 1e-4  # the new adapter's forward
        assert diffs(policy, prompt, result).max() > 1e-3  # not the old adapter any more
    engine.update_weights(adapter_state_dict(policy.state_dict()), version + 1)  # back
    REPORT.append(f"vLLM CPU LoRA adapter-only push: {took:.3f} s, {len(new)} tensors")


def test_an_in_flight_adapter_update_labels_the_tokens_of_each_adapter(lora_served) -> None:
    driver, _, policy = lora_served
    engine = driver.engine
    assert engine.weight_update == "in_flight"
    old_version = engine.version
    long = driver.submit(PROMPTS[0], sampling_params(max_new_tokens=110, seed=21))
    wait_for(lambda: engine.in_flight > 0, 60, "the request in flight", interval=0.001)
    time.sleep(0.05)
    new = moved_adapter(policy, seed=9)
    updater = threading.Thread(target=engine.update_weights, args=(new, old_version + 1))
    updater.start()
    updater.join(300)
    result = long.result(timeout=300)
    engine.update_weights(adapter_state_dict(policy.state_dict()), old_version + 2)
    assert result.versions == sorted(result.versions)
    before = result.versions.count(old_version)
    assert 0 < before < len(result.versions) and set(result.versions) == {
        old_version,
        old_version + 1,
    }
    assert diffs(policy, PROMPTS[0], result)[:before].max() < 1e-4
    assert diffs(policy, PROMPTS[0], result)[before:].max() > 1e-3  # the new adapter from there


def test_a_full_weight_push_to_a_lora_engine_is_refused(lora_served) -> None:
    driver, base, _ = lora_served
    with pytest.raises(EngineError, match="adapter tensors only"):
        driver.engine.update_weights(base.state_dict(), driver.engine.version + 1)
