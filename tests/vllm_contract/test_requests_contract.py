"""What frlab asks vLLM for, parsed by vLLM's own request models and argument classes
(vllm/entrypoints/openai/completion/protocol.py, vllm/sampling_params.py,
vllm/engine/arg_utils.py), and what vLLM answers, fed to frlab's parsers from vLLM's own
response models."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers.vllm_contract import tiny_model, vllm_config

from frlab.defaults import sampling_params
from frlab.rollout.remote import protocol as proto
from frlab.rollout.vllm.args import check_served_mode, vllm_engine_kwargs, vllm_sampling_kwargs

pytestmark = pytest.mark.vllm_contract

# what `--generation-config auto` takes from a model's generation_config.json: the penalties
# and min_p (since 0.31 presence / frequency penalties too, since 0.33 skip_special_tokens)
MODEL_DEFAULTS = {
    "repetition_penalty": 1.3,
    "temperature": 0.6,
    "top_p": 0.9,
    "top_k": 20,
    "min_p": 0.1,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.4,
    "skip_special_tokens": True,
}
PARAMS = sampling_params(temperature=0.7, max_new_tokens=12, stop_token_ids=(2, 9))


def expected_sampling(sp) -> None:  # noqa: ANN001
    """The vLLM SamplingParams of frlab's contract for PARAMS."""
    assert sp.temperature == 0.7 and sp.top_p == 1.0 and sp.top_k in (0, -1)
    assert sp.min_p == 0.0 and sp.repetition_penalty == 1.0
    assert sp.presence_penalty == 0.0 and sp.frequency_penalty == 0.0
    assert sp.max_tokens == 12 and sp.stop_token_ids == [2, 9] and sp.ignore_eos is True
    assert sp.logprobs == 1 and sp.seed == 5 and sp.n == 1
    assert sp.skip_special_tokens is False


def test_the_completion_body_is_vllms_and_no_model_default_leaks_in() -> None:
    """through `CompletionRequest.to_sampling_params` with the defaults
    a generation config would give, the sampling is exactly frlab's; the body frlab sent
    before (no penalties, min_p) took the model's repetition penalty and min_p."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    body = proto.completion_request("m", [1, 2, 3], PARAMS, seed=5)
    request = CompletionRequest.model_validate(body)
    assert request.prompt == [1, 2, 3] and request.return_token_ids is True
    expected_sampling(request.to_sampling_params(12, dict(MODEL_DEFAULTS)))
    old = {
        k: v
        for k, v in body.items()
        if k not in ("min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
    }
    leaked = CompletionRequest.model_validate(old).to_sampling_params(12, dict(MODEL_DEFAULTS))
    assert leaked.repetition_penalty == 1.3 and leaked.min_p == 0.1  # the bias, before the fix
    unset = {k: v for k, v in body.items() if k != "skip_special_tokens"}
    special = CompletionRequest.model_validate(unset).to_sampling_params(12, dict(MODEL_DEFAULTS))
    assert special.skip_special_tokens is True  # a default frlab must keep sending explicitly


def test_in_process_sampling_kwargs_build_vllms_sampling_params() -> None:
    from vllm import SamplingParams as VllmSamplingParams

    sp = VllmSamplingParams(**vllm_sampling_kwargs(PARAMS, seed=5))
    expected_sampling(sp)
    assert sp.detokenize is False and sp.skip_special_tokens is False


def test_engine_kwargs_build_vllms_engine_args_and_config(tmp_path: Path) -> None:
    """The in-process engine's arguments are AsyncEngineArgs fields; the config vLLM builds
    from them reports processed log-probs and no model sampling defaults."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    model = str(tiny_model(tmp_path / "tiny"))
    fields = [f.name for f in dataclasses.fields(AsyncEngineArgs)]
    kwargs = vllm_engine_kwargs(model, fields, seed=1, max_model_len=128)
    args = AsyncEngineArgs(**kwargs)
    assert args.logprobs_mode == "processed_logprobs" and args.generation_config == "vllm"
    config = vllm_config(
        model,
        logprobs_mode="processed_logprobs",
        generation_config="vllm",
        worker_extension_cls=kwargs["worker_extension_cls"],
    )
    assert config.model_config.get_diff_sampling_param() == {}
    assert config.parallel_config.worker_extension_cls == kwargs["worker_extension_cls"]
    check_served_mode(type("E", (), {"vllm_config": config})())
    auto = vllm_config(model)  # vllm serve's defaults: the model's generation config leaks
    leaked = auto.model_config.get_diff_sampling_param()
    assert leaked["repetition_penalty"] == 1.3
    # since 0.31 the model's presence / frequency penalties leak too (frlab sends both)
    assert (
        leaked.get("presence_penalty", 0.5) == 0.5 and leaked.get("frequency_penalty", 0.4) == 0.4
    )
    with pytest.raises(Exception, match="logprobs_mode"):
        check_served_mode(type("E", (), {"vllm_config": auto})())


def test_frlab_reads_vllms_own_completion_response() -> None:
    """A response built from vLLM's response models, as its server serialises it."""
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionLogProbs,
        CompletionResponse,
        CompletionResponseChoice,
    )

    try:  # vllm 0.29
        from vllm.entrypoints.serve.engine.protocol import UsageInfo
    except ImportError:  # vllm 0.28
        from vllm.entrypoints.openai.engine.protocol import UsageInfo

    logprobs = CompletionLogProbs(
        text_offset=[0, 0],
        token_logprobs=[-0.25, -1.5],
        tokens=["token_id:7", "token_id:3"],
        top_logprobs=[{"token_id:7": -0.25}, {"token_id:3": -1.5}],
    )
    choice = CompletionResponseChoice(
        index=0,
        text="",
        logprobs=logprobs,
        finish_reason="length",
        token_ids=[7, 3],
        prompt_token_ids=[1, 2],
    )
    usage = UsageInfo(prompt_tokens=2, completion_tokens=2, total_tokens=4)
    body = CompletionResponse(model="m", choices=[choice], usage=usage).model_dump(mode="json")
    assert proto.parse_completion(body, [1, 2]) == proto.Completion(
        [7, 3], [-0.25, -1.5], None, "length"
    )


def test_frlab_serves_a_response_vllms_model_accepts() -> None:
    from vllm.entrypoints.openai.completion.protocol import CompletionResponse

    body = proto.completion_response("m", [1, 2], [7, 3], [-0.25, -1.5], [4, 4], "stop", "x")
    parsed = CompletionResponse.model_validate(body)
    assert parsed.choices[0].token_ids == [7, 3]
    assert parsed.choices[0].logprobs.token_logprobs == [-0.25, -1.5]


def test_the_fleet_drops_idle_connections_before_vllms_server_closes_them() -> None:
    """A pooled connection reused just as vLLM's server closes it (its keep-alive timeout)
    fails the request with a transport error: the fleet's client expires idle connections well
    before the installed vLLM's default keep-alive timeout."""
    from vllm import envs

    from frlab.rollout.remote.fleet import KEEPALIVE_S

    assert KEEPALIVE_S <= envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE / 2
