"""The HTTP protocol subset the `remote` rollout backend speaks: vLLM's OpenAI-compatible server.

Token in, token out (no re-tokenisation ever): the prompt goes to `POST /v1/completions` as a
list of token ids (the OpenAI `prompt` field accepts one), and the request sets vLLM's
documented extras `return_token_ids` (the choice carries `token_ids` and `prompt_token_ids`),
`return_tokens_as_token_ids` (log-prob tokens spelled `token_id:<id>`, a fallback source of
ids), `logprobs: 1` (the choice's `logprobs.token_logprobs` holds the sampled token's
log-prob; vLLM must run with `--logprobs-mode processed_logprobs` so that it is the log-prob
after temperature / top-k / top-p: `control.served_logprobs_mode` reads it from the dev endpoint
`GET /server_info?config_format=json`, and a server that does not report it is refused),
`ignore_eos` and `stop_token_ids` (frlab stops only on its own stop ids, as the torch engine
does), `skip_special_tokens: false`. A request ended by vLLM's `POST /pause?mode=abort` or
`POST /abort_requests` (dev mode, `vllm/entrypoints/rl/online/api_router.py`) answers as a
completion with `finish_reason: "abort"` and the tokens sampled so far (maybe none). Every
sampling field is sent, penalties neutral: vLLM's
`CompletionRequest.to_sampling_params` fills an unsent field from the model's
`generation_config.json` (`vllm serve` defaults to `--generation-config auto`), and a
repetition penalty the learner never applies would bias the importance ratios silently.

`python -m frlab.serve` additionally returns `frlab_versions` (one per sampled token) in each
choice; vLLM does not, and the client then uses the version the server itself reported after
the last sync.

The routes of the control plane are named here too; the bodies they take and the answers
they give are read and written by frlab.rollout.remote.control.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


NEUTRAL_SAMPLING = {
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


def sampling_from_request(body: Mapping[str, Any]) -> tuple[list[int], SamplingParams]:
    """Server side: the prompt ids and SamplingParams of a completions body (ValueError if bad)."""
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(is_int(t) for t in prompt):
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
    if not is_int(seed) or not -(2**63) <= int(seed) < 2**63:
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
    usage = {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(tokens),
        "total_tokens": len(prompt) + len(tokens),
    }
    return {
        "id": request_id,
        "object": "text_completion",
        "created": 0,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


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


def is_int(x: Any) -> bool:
    """An int of JSON, not a bool (True is an int to Python, never an id or a version)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _token_ids(choice: Mapping[str, Any]) -> list[int]:
    ids = choice.get("token_ids")
    if ids is None:  # older vLLM: ids only as `token_id:<id>` log-prob tokens
        ids = [_id_from_token(t) for t in choice["logprobs"]["tokens"]]
    if not isinstance(ids, list) or not all(is_int(t) and t >= 0 for t in ids):
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
    if not isinstance(values, list) or len(values) != n or not all(is_int(v) for v in values):
        raise MalformedResponse(f"{VERSIONS_FIELD} must list {n} integer versions")
    return list(values)
