"""The HTTP protocol subset the `remote` rollout backend speaks: vLLM's OpenAI-compatible server.

Token in, token out (no re-tokenisation ever): the prompt goes to `POST /v1/completions` as a
list of token ids (the OpenAI `prompt` field accepts one), and the request sets vLLM's
documented extras `return_token_ids` (the choice carries `token_ids` and `prompt_token_ids`),
`return_tokens_as_token_ids` (log-prob tokens spelled `token_id:<id>`, a fallback source of
ids), `logprobs: 1` (the choice's `logprobs.token_logprobs` holds the sampled token's
log-prob; vLLM must run with `--logprobs-mode processed_logprobs` so that it is the log-prob
after temperature / top-k / top-p: `served_logprobs_mode` reads it from the dev endpoint
`GET /server_info?config_format=json`, and a server that does not report it is refused),
`ignore_eos` and `stop_token_ids` (frlab stops only on its own stop ids, as the torch engine
does), `skip_special_tokens: false`. A request ended by vLLM's `POST /pause?mode=abort` or
`POST /abort_requests` (dev mode, `vllm/entrypoints/rl/online/api_router.py`) answers as a
completion with `finish_reason: "abort"` and the tokens sampled so far (maybe none). Every
sampling field is sent, penalties neutral: vLLM's
`CompletionRequest.to_sampling_params` fills an unsent field from the model's
`generation_config.json` (`vllm serve` defaults to `--generation-config auto`), and a
repetition penalty the learner never applies would bias the importance ratios silently.

Weight versions are frlab's extension. A server run with frlab's worker extension
(`frlab.rollout.remote.worker_extension.WeightUpdateExtension`, reached through vLLM's dev endpoint
`POST /collective_rpc {"method", "args", "kwargs", "timeout"} -> {"results": [...]}`) answers
`frlab_weight_version` and loads snapshots with `frlab_load_snapshot`. vLLM's router
(`vllm/entrypoints/serve/dev/rpc/api_router.py`, `collective_rpc`) sends a worker's result
as it is only when it is a dict, a list or None, anything else as `str(result)` (a version 3
arrives as "3", False as the truthy "False"); so every frlab worker method answers a dict and
the client parses it strictly (`rpc_dicts`, `rpc_versions`, `rpc_flags`). `rpc_answer` is the
router's rule, for servers that imitate vLLM (frlab.serve, the test fakes). `GET /health`
answers 200 with an EMPTY body (`vllm/entrypoints/serve/instrumentator/health.py`): health is
the status code. `POST /reset_prefix_cache` answers `{"success": bool}` (`reset_succeeded`).
`python -m frlab.serve` additionally returns `frlab_versions` (one per sampled token) in each
choice; vLLM does not, and the client then uses the version the server itself reported after
the last sync.

vLLM's NCCL weight-transfer endpoints (`--weight-transfer-config '{"backend": "nccl"}'`):
`POST /init_weight_transfer_engine {"init_info": {master_address, master_port, rank_offset,
world_size, packed, ...}}`, `POST /start_weight_update`, `POST /update_weights {"update_info":
{names, dtype_names, shapes}}`, `POST /finish_weight_update {"weight_version"}`, and `GET
/get_world_size -> {"world_size"}` (a server's worker count, TP x PP x DP). `packed` is a wire
parameter of the INIT info (`NCCLWeightTransferInitInfo`); the update info has exactly names,
dtype_names and shapes (`NCCLWeightTransferUpdateInfo`, which refuses any other key). vLLM's
trainer engine (frlab.rollout.remote.nccl) builds the bodies it sends itself; frlab only sets
each server's `rank_offset` (`nccl_rank_offsets`). `nccl_init_request` / `nccl_update_request`
spell the same bodies out for tests and tools. The `vllm_contract` tests parse every body
here with vLLM's own request models and feed the parsers vLLM's own answers (CPU, the pinned
wheel); nothing here has run against a vLLM serving on a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from frlab.rollout.engine import SamplingParams

HEALTH = "/health"
MODELS = "/v1/models"
COMPLETIONS = "/v1/completions"
COLLECTIVE_RPC = "/collective_rpc"
RESET_PREFIX_CACHE = "/reset_prefix_cache"
INIT_WEIGHT_TRANSFER = "/init_weight_transfer_engine"
START_WEIGHT_UPDATE = "/start_weight_update"
UPDATE_WEIGHTS = "/update_weights"
FINISH_WEIGHT_UPDATE = "/finish_weight_update"
WORLD_SIZE = "/get_world_size"
SERVER_INFO = "/server_info?config_format=json"
PAUSE_ABORT = "/pause?mode=abort"  # vLLM's dev-mode RL router: end every request, queue new ones
RESUME = "/resume"
ABORT_REQUESTS = "/abort_requests"  # body {}: abort every request the server holds
WEIGHT_UPDATE_FIELD = "frlab_weight_update"  # frlab.serve's /server_info: its engine's mode
PROCESSED_LOGPROBS = "processed_logprobs"
VERSIONS_FIELD = "frlab_versions"
TOKEN_ID_PREFIX = "token_id:"


class MalformedResponse(ValueError):
    """A server answer that does not have the documented shape (a "garbage" answer)."""


@dataclass(frozen=True)
class Completion:
    """One parsed choice: sampled ids, their log-probs, per-token versions (None if absent)."""

    token_ids: list[int]
    log_probs: list[float]
    versions: list[int] | None
    finish_reason: str


def completion_request(
    model: str, prompt: Sequence[int], params: SamplingParams, *, seed: int | None = None
) -> dict[str, Any]:
    """The `/v1/completions` body for one token-id prompt (vLLM's documented field names); every
    sampling field is explicit so no server default (generation config) can change it."""
    params.validate(off_policy_correction=False)
    body: dict[str, Any] = {
        "model": model,
        "prompt": [int(t) for t in prompt],
        "n": 1,
        "stream": False,
        "max_tokens": int(params.max_new_tokens),
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k),  # 0: off
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stop_token_ids": [int(t) for t in params.stop_token_ids],
        "ignore_eos": True,
        "logprobs": 1,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
    }
    if seed is not None:
        body["seed"] = int(seed)
    return body


NEUTRAL_SAMPLING = {"min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                    "frequency_penalty": 0.0}  # fmt: skip


def sampling_from_request(body: Mapping[str, Any]) -> tuple[list[int], SamplingParams]:
    """Server side: the prompt ids and SamplingParams of a completions body (ValueError if bad)."""
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(_is_int(t) for t in prompt):
        raise ValueError("`prompt` must be a non-empty list of token ids")
    if int(body.get("n", 1)) != 1 or body.get("stream", False):
        raise ValueError("only n=1, stream=false is served")
    for key, neutral in NEUTRAL_SAMPLING.items():
        if body.get(key) is not None and float(body[key]) != neutral:
            raise ValueError(f"`{key}` must be {neutral} (unset or neutral), got {body[key]}")
    top_k = int(_given(body, "top_k", 0))
    params = SamplingParams(
        temperature=float(_given(body, "temperature", 1.0)),
        top_p=float(_given(body, "top_p", 1.0)),
        top_k=0 if top_k < 0 else top_k,
        max_new_tokens=int(body.get("max_tokens", 16)),
        stop_token_ids=tuple(int(t) for t in body.get("stop_token_ids") or ()),
        seed=request_seed(body.get("seed")),
    )
    params.validate(off_policy_correction=False)
    return [int(t) for t in prompt], params


def request_seed(seed: Any) -> int | None:
    """A completions body's `seed` (vLLM takes any signed 64-bit int) as a SamplingParams seed
    in [0, 2**63): negative values are folded (seed mod 2**63); None stays None."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not _is_int(seed) or not -(2**63) <= int(seed) < 2**63:
        raise ValueError(f"`seed` must be a 64-bit integer, got {seed!r}")
    return int(seed) % 2**63


def completion_response(
    model: str,
    prompt: Sequence[int],
    token_ids: Sequence[int],
    log_probs: Sequence[float],
    versions: Sequence[int],
    finish_reason: str,
    request_id: str,
) -> dict[str, Any]:
    """Server side: a vLLM-shaped completions answer plus frlab's per-token versions."""
    tokens = [f"{TOKEN_ID_PREFIX}{int(t)}" for t in token_ids]
    choice = {
        "index": 0,
        "text": "",
        "logprobs": {
            "text_offset": [0] * len(tokens),
            "token_logprobs": [float(x) for x in log_probs],
            "tokens": tokens,
            "top_logprobs": [{tok: float(x)} for tok, x in zip(tokens, log_probs, strict=True)],
        },
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_token_ids": [int(t) for t in prompt],
        "token_ids": [int(t) for t in token_ids],
        VERSIONS_FIELD: [int(v) for v in versions],
    }
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(tokens),
             "total_tokens": len(prompt) + len(tokens)}  # fmt: skip
    return {"id": request_id, "object": "text_completion", "created": 0, "model": model,
            "choices": [choice], "usage": usage}  # fmt: skip


def parse_completion(body: Any, prompt: Sequence[int] | None = None) -> Completion:
    """Client side: the one choice of a completions answer; MalformedResponse if it is not
    exactly the documented shape (ids, finite log-probs <= 0, equal lengths, stop|length, or
    abort with the tokens sampled before it, maybe none)."""
    try:
        choices = body["choices"]
        if not isinstance(choices, list) or len(choices) != 1:
            raise MalformedResponse(f"expected one choice, got {choices!r:.200}")
        choice = choices[0]
        token_ids = _token_ids(choice)
        log_probs = _log_probs(choice["logprobs"], len(token_ids))
        versions = _versions(choice.get(VERSIONS_FIELD), len(token_ids))
        reason = choice["finish_reason"]
        echoed = choice.get("prompt_token_ids")
    except (KeyError, TypeError, AttributeError) as exc:
        raise MalformedResponse(f"completion answer lacks a field: {exc!r}") from exc
    if reason not in ("stop", "length", "abort"):
        raise MalformedResponse(f"finish_reason must be stop|length|abort, got {reason!r}")
    if prompt is not None and echoed is not None and list(echoed) != list(prompt):
        raise MalformedResponse("prompt_token_ids in the answer differ from the prompt sent")
    if not token_ids and reason != "abort":
        raise MalformedResponse("the answer has no sampled token")
    return Completion(token_ids, log_probs, versions, reason)


def _given(body: Mapping[str, Any], key: str, default: Any) -> Any:
    """`body[key]`, or `default` when absent or null (vLLM's defaults for unset fields)."""
    value = body.get(key)
    return default if value is None else value


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _token_ids(choice: Mapping[str, Any]) -> list[int]:
    ids = choice.get("token_ids")
    if ids is None:  # older vLLM: ids only as `token_id:<id>` log-prob tokens
        ids = [_id_from_token(t) for t in choice["logprobs"]["tokens"]]
    if not isinstance(ids, list) or not all(_is_int(t) and t >= 0 for t in ids):
        raise MalformedResponse(f"token_ids must be a list of ids, got {ids!r:.200}")
    return ids


def _id_from_token(token: Any) -> int:
    if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
        raise MalformedResponse(f"log-prob token {token!r} is not `token_id:<id>`")
    return int(token[len(TOKEN_ID_PREFIX) :])


def _log_probs(logprobs: Mapping[str, Any], n: int) -> list[float]:
    values = logprobs["token_logprobs"]
    if not isinstance(values, list) or len(values) != n:
        raise MalformedResponse(f"token_logprobs must list {n} values, got {values!r:.200}")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v > 0:
            raise MalformedResponse(f"token_logprobs[{i}] = {v!r} is not a log-probability")
        out.append(float(v))
    return out


def _versions(values: Any, n: int) -> list[int] | None:
    if values is None:
        return None
    if not isinstance(values, list) or len(values) != n or not all(_is_int(v) for v in values):
        raise MalformedResponse(f"{VERSIONS_FIELD} must list {n} integer versions")
    return list(values)


# -- control plane ---------------------------------------------------------------------------
def rpc_request(
    method: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A body for vLLM's dev endpoint `POST /collective_rpc`."""
    body: dict[str, Any] = {"method": str(method), "args": list(args), "kwargs": dict(kwargs or {})}
    if timeout is not None:
        body["timeout"] = float(timeout)
    return body


def rpc_results(body: Any) -> list[Any]:
    """The per-worker `results` of a `/collective_rpc` answer (MalformedResponse if absent)."""
    results = body.get("results") if isinstance(body, Mapping) else None
    if not isinstance(results, list) or not results:
        raise MalformedResponse(f"collective_rpc answer has no results: {body!r:.200}")
    return results


def rpc_dicts(body: Any, key: str) -> list[Mapping[str, Any]]:
    """The per-worker results, each a dict holding `key` (MalformedResponse otherwise: e.g. a
    scalar that vLLM's router stringified, from a worker extension that answers no dict)."""
    results = rpc_results(body)
    for i, result in enumerate(results):
        if not isinstance(result, Mapping) or key not in result:
            raise MalformedResponse(
                f"collective_rpc result {i} is {result!r:.120}, not a dict with {key!r}: is the "
                "server's --worker-extension-cls this frlab's WeightUpdateExtension?"
            )
    return results


def rpc_versions(body: Any) -> list[int | None]:
    """Each worker's `{"version": int | None}` (`frlab_weight_version`), strictly."""
    out = []
    for result in rpc_dicts(body, "version"):
        version = result["version"]
        if version is not None and not _is_int(version):
            raise MalformedResponse(f"weight version {version!r} is not an int or null")
        out.append(version)
    return out


def rpc_flags(body: Any, key: str) -> list[bool]:
    """Each worker's `{key: bool}`, strictly (a stringified "False" is not True)."""
    out = []
    for result in rpc_dicts(body, key):
        if not isinstance(result[key], bool):
            raise MalformedResponse(f"{key} {result[key]!r} is not a boolean")
        out.append(result[key])
    return out


def rpc_answer(results: Sequence[Any] | None) -> dict[str, Any] | None:
    """What vLLM's dev router answers for these worker results (None: an empty 200 body):
    dicts, lists and None as they are, anything else as `str(result)`. For servers that
    imitate vLLM (frlab.serve, test fakes)."""
    if results is None:
        return None
    return {"results": [r if r is None or isinstance(r, dict | list) else str(r)
                        for r in results]}  # fmt: skip


def reset_succeeded(body: Any) -> bool:
    """The `success` flag of a `/reset_prefix_cache` answer (MalformedResponse if absent)."""
    success = body.get("success") if isinstance(body, Mapping) else None
    if not isinstance(success, bool):
        raise MalformedResponse(f"/reset_prefix_cache answer has no success flag: {body!r:.200}")
    return success


def served_logprobs_mode(body: Any) -> str:
    """`vllm_config.model_config.logprobs_mode` of a `/server_info?config_format=json` answer."""
    try:
        mode = body["vllm_config"]["model_config"]["logprobs_mode"]
    except (KeyError, TypeError) as exc:
        raise MalformedResponse(f"/server_info answer has no logprobs_mode: {body!r:.200}") from exc
    if not isinstance(mode, str):
        raise MalformedResponse(f"logprobs_mode {mode!r} is not a string")
    return mode


def server_info(
    logprobs_mode: str, generation_config: str = "vllm", weight_update: str | None = None
) -> dict[str, Any]:
    """Server side: the part of vLLM's `/server_info?config_format=json` answer frlab reads,
    plus frlab.serve's own weight-update mode (vLLM has no such field)."""
    model_config = {"logprobs_mode": logprobs_mode, "generation_config": generation_config}
    info = {"vllm_config": {"model_config": model_config}, "vllm_env": {}, "system_env": {}}
    if weight_update is not None:
        info[WEIGHT_UPDATE_FIELD] = weight_update
    return info


def served_weight_update(body: Any) -> str | None:
    """frlab.serve's weight-update mode in a `/server_info` answer (None from vLLM)."""
    mode = body.get(WEIGHT_UPDATE_FIELD) if isinstance(body, Mapping) else None
    if mode is not None and not isinstance(mode, str):
        raise MalformedResponse(f"{WEIGHT_UPDATE_FIELD} {mode!r} is not a string")
    return mode


def served_model(body: Any) -> str:
    """The first model id of a `/v1/models` answer."""
    try:
        return str(body["data"][0]["id"])
    except (KeyError, IndexError, TypeError) as exc:
        raise MalformedResponse(f"/v1/models answer has no model id: {body!r:.200}") from exc


def nccl_init_request(
    master_address: str, master_port: int, world_size: int, rank_offset: int = 1,
    packed: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """`POST /init_weight_transfer_engine` body (the trainer is rank 0 of the NCCL group);
    `packed` is a wire parameter of the init info, as vLLM's trainer engine sends it."""
    if int(world_size) < 2 or not 0 < int(rank_offset) < int(world_size):
        raise ValueError("NCCL weight transfer needs world_size >= 2 and 0 < rank_offset < it")
    info = {"master_address": str(master_address), "master_port": int(master_port),
            "rank_offset": int(rank_offset), "world_size": int(world_size),
            "packed": bool(packed)}  # fmt: skip
    return {"init_info": info}


def nccl_update_request(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """`POST /update_weights` body: names, dtypes and shapes in the order they are broadcast
    (exactly the fields of vLLM's `NCCLWeightTransferUpdateInfo`)."""
    if not named_tensors:
        raise ValueError("nothing to send: the state dict is empty")
    names = [str(n) for n, _ in named_tensors]
    dtypes = [str(t.dtype).removeprefix("torch.") for _, t in named_tensors]
    shapes = [list(t.shape) for _, t in named_tensors]
    return {"update_info": {"names": names, "dtype_names": dtypes, "shapes": shapes}}


def world_size_of(body: Any) -> int:
    """The worker count in a `/get_world_size` answer (MalformedResponse unless an int >= 1)."""
    size = body.get("world_size") if isinstance(body, Mapping) else None
    if not _is_int(size) or size < 1:
        raise MalformedResponse(f"/get_world_size answer has no worker count: {body!r:.200}")
    return int(size)


def nccl_rank_offsets(worker_counts: Sequence[int]) -> tuple[list[int], int]:
    """Each server's first NCCL rank and the group size: the trainer is rank 0, then each
    server's workers in the order listed (server i starts after the workers of 0..i-1)."""
    if not worker_counts or any(int(n) < 1 for n in worker_counts):
        raise ValueError(f"every server needs >= 1 worker, got {list(worker_counts)}")
    offsets, next_rank = [], 1
    for n in worker_counts:
        offsets.append(next_rank)
        next_rank += int(n)
    return offsets, next_rank
