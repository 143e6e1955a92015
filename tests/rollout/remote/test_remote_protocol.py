"""The remote backend without servers: vLLM request/response shaping against constructed JSON,
engine metrics and argument checks (snapshots and their load by the worker extension:
tests/rollout/vllm_backend/test_snapshot.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers.fleet import FLEET_KEYS, fleet_settings, remote_engine
from helpers.nccl import nccl_init_request, nccl_update_request

from frlab.defaults import sampling_params
from frlab.errors import ConfigError
from frlab.rollout.callbacks import rollout_metrics
from frlab.rollout.engine import SamplingParams
from frlab.rollout.remote import control
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.engine import RemoteEngine, Server

# The shape vLLM's OpenAI server documents for /v1/completions with logprobs=1,
# return_token_ids and return_tokens_as_token_ids (no frlab_versions: that is frlab.serve's).
VLLM_ANSWER = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "text": "ab",
            "logprobs": {
                "text_offset": [0, 1],
                "token_logprobs": [-0.25, -1.5],
                "tokens": ["token_id:7", "token_id:3"],
                "top_logprobs": [{"token_id:7": -0.25}, {"token_id:3": -1.5}],
            },
            "finish_reason": "length",
            "stop_reason": None,
            "prompt_token_ids": [1, 2],
            "token_ids": [7, 3],
        }
    ],
    "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
}


def _answer(**choice_changes: object) -> dict:
    choice = {**VLLM_ANSWER["choices"][0], **choice_changes}
    return {**VLLM_ANSWER, "choices": [choice]}


def test_completion_request_uses_vllm_field_names() -> None:
    body = proto.completion_request("m", [1, 2], SamplingParams(0.7, 1.0, 0, 12, (2, 9)), seed=5)
    assert body == {
        "model": "m",
        "prompt": [1, 2],
        "n": 1,
        "stream": False,
        "max_tokens": 12,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stop_token_ids": [2, 9],
        "ignore_eos": True,
        "logprobs": 1,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "seed": 5,
    }
    prompt, params = proto.sampling_from_request(body)
    assert prompt == [1, 2] and params == SamplingParams(0.7, 1.0, 0, 12, (2, 9), seed=5)
    for bad in (
        {"prompt": "text"},
        {"prompt": []},
        {"prompt": [1], "n": 2},
        {"prompt": [1], "repetition_penalty": 1.1},
    ):
        with pytest.raises(ValueError):
            proto.sampling_from_request(bad)


def test_every_sampling_field_a_server_default_could_fill_is_sent() -> None:
    """`vllm serve` defaults to `--generation-config auto`, and vLLM's
    `CompletionRequest.to_sampling_params` (vllm/entrypoints/openai/completion/protocol.py)
    takes repetition_penalty, temperature, top_p, top_k and min_p from the model's
    generation_config.json whenever the request leaves them unset (None). So each must be
    sent, neutral unless frlab samples with it; the OpenAI-side penalties too."""
    body = proto.completion_request("m", [1], sampling_params(), seed=None)
    defaults_could_fill = ("repetition_penalty", "temperature", "top_p", "top_k", "min_p")
    assert all(body.get(k) is not None for k in defaults_could_fill)
    assert (body["repetition_penalty"], body["min_p"], body["top_k"]) == (1.0, 0.0, 0)
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0.0, 0.0)


def test_parse_a_vllm_answer_without_versions_and_one_with_ids_only_as_tokens() -> None:
    done = proto.parse_completion(VLLM_ANSWER, prompt=[1, 2])
    assert done == proto.Completion([7, 3], [-0.25, -1.5], None, "length")
    older = _answer(token_ids=None)
    del older["choices"][0]["token_ids"]
    assert proto.parse_completion(older).token_ids == [7, 3]


def test_the_server_answer_round_trips_with_versions() -> None:
    body = proto.completion_response("m", [1, 2], [7, 3], [-0.25, -1.5], [4, 5], "stop", "x")
    assert body["choices"][0]["logprobs"]["tokens"] == ["token_id:7", "token_id:3"]
    assert proto.parse_completion(body, [1, 2]) == proto.Completion(
        [7, 3], [-0.25, -1.5], [4, 5], "stop"
    )


def test_an_aborted_answer_carries_the_tokens_sampled_before_it() -> None:
    """vLLM answers a request ended by `/pause?mode=abort` as a completion with finish_reason
    abort and its tokens so far, maybe none (a request still queued)."""
    body = proto.completion_response("m", [1, 2], [7], [-0.25], [0], "abort", "x")
    assert proto.parse_completion(body, [1, 2]) == proto.Completion([7], [-0.25], [0], "abort")
    empty = proto.completion_response("m", [1, 2], [], [], [], "abort", "x")
    assert proto.parse_completion(empty, [1, 2]).token_ids == []
    with pytest.raises(proto.MalformedResponse):  # only an abort may come back empty
        proto.parse_completion(proto.completion_response("m", [1], [], [], [], "length", "x"))


@pytest.mark.parametrize(
    "answer",
    [
        {"no": "choices"},
        {"choices": []},
        _answer(finish_reason="error"),
        _answer(token_ids=[7]),  # fewer ids than log-probs
        _answer(token_ids=[]),
        _answer(token_ids=[7, -3]),
        _answer(prompt_token_ids=[1, 9]),  # not the prompt we sent
        _answer(logprobs={"token_logprobs": [-0.25, 0.5]}),  # a positive log-prob
        _answer(logprobs={"token_logprobs": [-0.25, math.nan]}),
        _answer(logprobs=None),
        _answer(frlab_versions=[1]),
        _answer(frlab_versions=[1, "2"]),
    ],
)
def test_garbage_answers_are_malformed(answer: dict) -> None:
    with pytest.raises(proto.MalformedResponse):
        proto.parse_completion(answer, prompt=[1, 2])


def test_control_plane_bodies() -> None:
    assert control.rpc_request("frlab_load_snapshot", ["/s/v3/model.safetensors", 3]) == {
        "method": "frlab_load_snapshot",
        "args": ["/s/v3/model.safetensors", 3],
        "kwargs": {},
    }
    assert control.rpc_results({"results": [3, 3]}) == [3, 3]
    with pytest.raises(proto.MalformedResponse):
        control.rpc_results({"error": "no dev mode"})
    assert control.served_model({"object": "list", "data": [{"id": "q"}]}) == "q"
    assert nccl_init_request("10.0.0.1", 29500, 3) == {
        "init_info": {
            "master_address": "10.0.0.1",
            "master_port": 29500,
            "rank_offset": 1,
            "world_size": 3,
            "packed": True,
        }
    }
    with pytest.raises(ValueError, match="world_size"):
        nccl_init_request("h", 1, 1)


def test_the_nccl_update_body_has_exactly_the_fields_vllm_parses() -> None:
    """vLLM's `NCCLWeightTransferUpdateInfo`
    (vllm/distributed/weight_transfer/nccl_engine.py) has exactly names, dtype_names, shapes;
    `WeightTransferEngine.parse_update_info` refuses any other key, and `packed` is a field of
    the INIT info (`NCCLWeightTransferInitInfo`, nccl_common.py)."""
    from helpers.nccl import INIT_FIELDS, INIT_REQUIRED, UPDATE_FIELDS, parse_info

    named = [("a.weight", torch.zeros(2, 3, dtype=torch.bfloat16)), ("b", torch.zeros(4))]
    update = nccl_update_request(named)["update_info"]
    assert parse_info(update, UPDATE_FIELDS, UPDATE_FIELDS) == {
        "names": ["a.weight", "b"],
        "dtype_names": ["bfloat16", "float32"],
        "shapes": [[2, 3], [4]],
    }
    init = nccl_init_request("10.0.0.1", 29500, 3, packed=False)["init_info"]
    assert parse_info(init, INIT_FIELDS, INIT_REQUIRED)["packed"] is False


def test_rpc_answers_are_parsed_strictly_as_vllm_sends_them() -> None:
    """vLLM's dev router (vllm/entrypoints/serve/dev/rpc/api_router.py,
    `collective_rpc`) sends results that are not a dict, list or None as `str(result)`: a
    version 3 arrives as "3" and never equals 3, False as the truthy "False". frlab's worker
    methods answer dicts and the client parses them strictly."""
    assert control.rpc_answer([3, False, None, {"a": 1}, [2]]) == {
        "results": ["3", "False", None, {"a": 1}, [2]]
    }
    assert control.rpc_answer(None) is None  # vLLM: an empty 200 body
    assert control.rpc_versions(control.rpc_answer([{"version": 3}, {"version": None}])) == [
        3,
        None,
    ]
    assert control.rpc_flags(control.rpc_answer([{"ready": False}]), "ready") == [False]
    for bad in (
        control.rpc_answer([3]),
        {"results": [{"version": "3"}]},
        {"results": [{"version": True}]},
        {"results": [{"v": 3}]},
    ):
        with pytest.raises(proto.MalformedResponse):
            control.rpc_versions(bad)
    with pytest.raises(proto.MalformedResponse):
        control.rpc_flags(control.rpc_answer([False]), "ready")  # "False": not a flag
    with pytest.raises(proto.MalformedResponse):
        control.rpc_flags({"results": [{"ready": "False"}]}, "ready")


def test_reset_and_server_info_answers() -> None:
    """vLLM's `/reset_prefix_cache` answers `{"success": bool}`
    (vllm/entrypoints/serve/dev/cache/api_router.py); `/server_info?config_format=json`
    dumps the VllmConfig (vllm/entrypoints/serve/dev/server_info/api_router.py)."""
    assert control.reset_succeeded({"success": True}) is True
    assert control.reset_succeeded({"success": False}) is False
    for bad in ({}, {"success": "true"}, None):
        with pytest.raises(proto.MalformedResponse):
            control.reset_succeeded(bad)
    info = control.server_info("processed_logprobs")
    assert control.served_logprobs_mode(info) == "processed_logprobs"
    with pytest.raises(proto.MalformedResponse):
        control.served_logprobs_mode({"vllm_config": "ModelConfig(...)"})  # config_format=text


def test_engine_counters_become_rollout_metrics() -> None:
    stats = {"started": 3, "engine": {"retries": 2, "servers_healthy": 3, "flag": True}}
    assert rollout_metrics(stats) == {"rollout/retries": 2.0, "rollout/servers_healthy": 3.0}
    assert rollout_metrics({"engine": {}}) == {} == rollout_metrics({"started": 1})


def test_remote_engine_is_built_from_its_settings_and_checks_its_servers(tmp_path: Path) -> None:
    settings = fleet_settings(["http://127.0.0.1:1/"], snapshot_dir=str(tmp_path))
    engine = RemoteEngine.for_policy(
        torch.nn.Linear(1, 1), seed=0, settings=settings, weight_update=None
    )
    assert isinstance(engine, RemoteEngine) and engine.servers[0].url == "http://127.0.0.1:1"
    assert engine.version == 0 and engine.stats()["servers_healthy"] == 0
    engine.shutdown()  # never started: nothing to stop
    bad = [([], "servers"), (["127.0.0.1:1"], "http"), (["http://a", "http://a"], "twice")]
    for servers, match in bad:
        with pytest.raises(ConfigError, match=match):
            remote_engine(servers)


def test_remote_engine_takes_every_fleet_setting_without_a_default_of_its_own() -> None:
    import inspect

    params = inspect.signature(RemoteEngine.__init__).parameters
    for key in FLEET_KEYS:
        assert params[key].kind is inspect.Parameter.KEYWORD_ONLY, key
        assert params[key].default is inspect.Parameter.empty, key


def test_requests_go_to_the_healthy_server_with_fewest_in_flight(tmp_path: Path) -> None:
    engine = remote_engine(
        ["http://a", "http://b", "http://c"], snapshot_dir=str(tmp_path), allow_unauthenticated=True
    )  # fake hosts: no server is reached
    a, b, c = engine.servers
    assert engine._fleet.pick() is None  # nothing verified yet
    a.state = b.state = c.state = "ok"
    a.in_flight, b.in_flight, c.in_flight = 2, 1, 1
    assert engine._fleet.pick() is b  # fewest in flight; the first listed on ties
    b.state = "stale"
    assert engine._fleet.pick() is c
    c.state = "dead"
    assert engine._fleet.pick() is a
    assert isinstance(engine._fleet.pick(), Server)


def test_serve_model_config_random_inits_the_architecture(tmp_path) -> None:
    """`python -m frlab.serve --model-config FILE` builds the architecture of a model config
    (the learner pushes its own weights before the first rollout); a file without a `config`
    mapping is refused naming the flag; --model and --model-config exclude each other."""
    from frlab.serve.__main__ import build_server_policy, parse_args

    root = Path(__file__).resolve().parents[3]
    args = parse_args(["--model-config", str(root / "configs/model/toy_qwen2.yaml")])
    policy = build_server_policy(args)
    assert (policy.config.vocab_size, policy.config.hidden_size) == (64, 64)
    assert policy.config.num_hidden_layers == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("name_or_path: null\n")
    with pytest.raises(SystemExit, match="--model-config"):
        build_server_policy(parse_args(["--model-config", str(bad)]))
    with pytest.raises(SystemExit):
        parse_args(["--model", "x", "--model-config", str(bad)])
