"""SamplingParams validation: IS needs the full support, so correction refuses top-p/top-k."""

from __future__ import annotations

import pytest

from frlab.defaults import sampling_params
from frlab.errors import ConfigError
from frlab.rollout.engine import GenerationResult, SamplingParams


@pytest.mark.parametrize(
    ("params", "key"),
    [
        (sampling_params(top_p=0.95), "rollout.sampling.top_p"),
        (sampling_params(top_k=20), "rollout.sampling.top_k"),
    ],
)
def test_truncated_sampling_is_refused_with_off_policy_correction(
    params: SamplingParams, key: str
) -> None:
    with pytest.raises(ValueError, match=key):
        params.validate(off_policy_correction=True)
    params.validate(off_policy_correction=False)  # allowed without correction (e.g. evaluation)


def test_full_support_sampling_passes_with_correction() -> None:
    sampling_params(temperature=0.7, top_p=1.0, top_k=0).validate(off_policy_correction=True)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
    ],
)
def test_invalid_values_name_their_field(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=f"rollout.sampling.{key}"):
        sampling_params(**kwargs).validate(off_policy_correction=False)


def test_from_mapping_reads_config_and_names_unknown_and_missing_keys() -> None:
    node = {"temperature": 0.5, "top_p": 1.0, "top_k": 0, "max_new_tokens": 3}
    p = SamplingParams.from_mapping({**node, "stop_token_ids": [2, 5]})
    assert p == SamplingParams(0.5, 1.0, 0, 3, stop_token_ids=(2, 5))
    with pytest.raises(ConfigError, match="rollout.sampling.top_q"):
        SamplingParams.from_mapping({**node, "top_q": 0.9})
    with pytest.raises(ConfigError, match="rollout.sampling.top_k"):
        SamplingParams.from_mapping({k: v for k, v in node.items() if k != "top_k"})


def test_generation_result_checks_alignment() -> None:
    GenerationResult([1, 2], [-0.1, -0.2], [0, 0], "stop")
    with pytest.raises(ValueError, match="log_probs"):
        GenerationResult([1, 2], [-0.1], [0, 0], "stop")
    with pytest.raises(ValueError, match="finish_reason"):
        GenerationResult([1], [-0.1], [0], "abort")
