"""The control plane of the `remote` rollout backend: the bodies of vLLM's dev and RL
endpoints (routes in frlab.rollout.remote.protocol) and strict parsers of their answers.

Weight versions are frlab's extension. A server run with frlab's worker extension
(`frlab.rollout.vllm.worker_extension.WeightUpdateExtension`, reached through vLLM's dev endpoint
`POST /collective_rpc {"method", "args", "kwargs", "timeout"} -> {"results": [...]}`) answers
`frlab_weight_version` and loads snapshots with `frlab_load_snapshot`. vLLM's router
(`vllm/entrypoints/serve/dev/rpc/api_router.py`, `collective_rpc`) sends a worker's result
as it is only when it is a dict, a list or None, anything else as `str(result)` (a version 3
arrives as "3", False as the truthy "False"); so every frlab worker method answers a dict and
the client parses it strictly (`rpc_dicts`, `rpc_versions`, `rpc_flags`). `rpc_answer` is the
router's rule, for servers that imitate vLLM (frlab.serve, the test fakes). `GET /health`
answers 200 with an EMPTY body (`vllm/entrypoints/serve/instrumentator/health.py`): health is
the status code. `POST /reset_prefix_cache` answers `{"success": bool}` (`reset_succeeded`).

vLLM's NCCL weight-transfer endpoints (`--weight-transfer-config '{"backend": "nccl"}'`):
`POST /init_weight_transfer_engine {"init_info": {master_address, master_port, rank_offset,
world_size, packed, ...}}`, `POST /start_weight_update`, `POST /update_weights {"update_info":
{names, dtype_names, shapes}}`, `POST /finish_weight_update {"weight_version"}`, and `GET
/get_world_size -> {"world_size"}` (a server's worker count, TP x PP x DP). `packed` is a wire
parameter of the INIT info (`NCCLWeightTransferInitInfo`); the update info has exactly names,
dtype_names and shapes (`NCCLWeightTransferUpdateInfo`, which refuses any other key). vLLM's
trainer engine (driven by frlab.rollout.remote.nccl) builds the bodies it sends itself; frlab
only sets each server's `rank_offset` (`nccl_rank_offsets`). The `vllm_contract` tests parse
every body (tests/helpers/nccl.py spells the NCCL ones out) with vLLM's own
request models and feed the parsers vLLM's own answers (CPU, the pinned
wheel); nothing here has run against a vLLM serving on a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from frlab.rollout.remote.protocol import WEIGHT_UPDATE_FIELD, MalformedResponse, is_int


def rpc_request(
    method: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
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
        if version is not None and not is_int(version):
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
    return {"results": [r if r is None or isinstance(r, dict | list) else str(r) for r in results]}


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


def world_size_of(body: Any) -> int:
    """The worker count in a `/get_world_size` answer (MalformedResponse unless an int >= 1)."""
    size = body.get("world_size") if isinstance(body, Mapping) else None
    if not is_int(size) or size < 1:
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
