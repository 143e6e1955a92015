"""A Python caller's arguments come from the declarations (frlab.config.arguments): a default
that follows another key is that key's declared default in the root, an `oc.select` falls back
to its word where the root declares no such key, and a key with no plain default must be given."""

from __future__ import annotations

import dataclasses

import pytest

from frlab.config import schema
from frlab.config.arguments import declared_arguments, declared_defaults, followed
from frlab.defaults import agent_loop_config, avg_at_k, sampling_params, torch_engine


def test_a_following_default_is_the_root_keys_declared_default() -> None:
    rollout = schema.RolloutConfig()
    engine = declared_arguments(schema.TorchEngineConfig)
    assert engine["max_batch_size"] == rollout.max_in_flight == 32
    assert engine["device"] == rollout.device and engine["weight_update"] is rollout.weight_update
    assert engine["record_routing"] is schema.ModelConfig().routing_replay is False
    # followed twice: eval sampling -> rollout.sampling.max_new_tokens
    budget = declared_defaults(schema.EvalSamplingConfig)["max_new_tokens"]
    assert budget == schema.SamplingConfig().max_new_tokens == 16
    # `arg=False` keys are left out of the arguments, kept in the defaults
    assert "env_timeout_s" not in declared_arguments(schema.RolloutConfig)
    assert declared_defaults(schema.RolloutConfig)["env_timeout_s"] == 300.0


def test_oc_select_falls_back_to_its_word_and_resolvers_are_not_followed() -> None:
    assert declared_defaults(schema.MathEvalConfig, ["template", "answer_format"]) == {
        "template": "instruct",
        "answer_format": "any",
    }
    assert followed("${hydra:runtime.output_dir}") == "${hydra:runtime.output_dir}"
    assert followed("${a}${b}") == "${a}${b}"
    assert followed(7) == 7


def test_a_key_without_a_plain_default_must_be_given_and_unknown_keys_are_refused() -> None:
    with pytest.raises(TypeError, match=r"VLLMEngineConfig.model has no plain default"):
        declared_arguments(schema.VLLMEngineConfig)  # follows model.name_or_path: required
    assert declared_arguments(schema.VLLMEngineConfig, model=None)["max_model_len"] == 64
    with pytest.raises(TypeError, match="declares no argument max_batchsize"):
        declared_arguments(schema.TorchEngineConfig, max_batchsize=4)


def test_the_builders_change_only_what_they_are_given() -> None:
    params = sampling_params(max_new_tokens=3, seed=9)
    assert dataclasses.asdict(params) == {
        **dataclasses.asdict(schema.SamplingConfig()),
        "max_new_tokens": 3,
        "stop_token_ids": (),
        "seed": 9,
    }
    loop = agent_loop_config(max_len=40, sampling={"temperature": 0.5})
    assert (loop.max_len, loop.max_turns, loop.sampling.temperature) == (40, 1, 0.5)
    assert loop.engine_timeout_s == schema.RolloutConfig().engine_timeout_s
    evaluation = avg_at_k({"b": "x.jsonl"}, 2, 5, limit=3)
    assert (evaluation.limit, evaluation.sampling.temperature, evaluation.template) == (
        3,
        schema.EvalSamplingConfig().temperature,
        "instruct",
    )


def test_an_engine_built_for_a_python_caller_has_the_declared_settings() -> None:
    from helpers.models import policy_of

    config = {
        "model_type": "qwen2",
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    engine = torch_engine(policy_of(config=config), max_batch_size=3)
    assert (engine.max_batch_size, engine.device.type, engine.record_routing) == (3, "cpu", False)
    assert engine.packed_prefill is schema.TorchEngineConfig().packed_prefill
