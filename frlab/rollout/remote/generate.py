"""vLLM's token-in/token-out endpoint and weight-version labels, as the `remote` engine uses them
for `rollout.weight_update=in_flight` on a fleet of real vLLM servers.

Read from vLLM 0.32's wheel (the CPU build): `POST /inference/v1/generate`
(`vllm/entrypoints/scale_out/token_in_token_out/`, registered with `vllm serve
--enable-scale-out`; without it the route answers 403 and is left out of `/openapi.json`)
takes `{"token_ids", "sampling_params": <vLLM SamplingParams fields>, "stream": false}` and
answers `{"choices": [{"token_ids", "finish_reason", "logprobs": {"content": [{"token_id",
"logprob", ...}]}, "weight_versions": [{"version", "start", "end"}]}], ...}`: contiguous spans
`[start, end)` over the output tokens, each labelled with the string the engine core held
when the step that sampled them ran (`EngineCore._attach_weight_version`,
`RequestState._weight_version_spans`; None when no label was reported). The dev-mode RL router
(`vllm/entrypoints/rl/online/api_router.py`, `VLLM_SERVER_DEV_MODE=1`) sets that label with
`POST /update_weight_version {"new_version": str}` -> `{"success": true, "new_version"}`
(an engine-core utility call: it runs between two steps) and freezes requests between two
decode steps with `POST /pause?mode=keep&clear_cache=false` (their KV cache kept; new requests
queued) until `POST /resume`; without `clear_cache=false` the pause resets the caches and
preempts the frozen requests, which then recompute their KV on the new weights.
A server offers labels when its `/openapi.json` lists all three routes
(`offers_labels`) and a one-token generate request answers with spans (`probe_request`,
`answers_labels`): vLLM 0.28 lists the routes, but its choices carry no spans.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from frlab.rollout.engine import SamplingParams
from frlab.rollout.remote.protocol import Completion, MalformedResponse, is_int
from frlab.rollout.vllm.args import vllm_sampling_kwargs
from frlab.rollout.weight_modes import span_versions

GENERATE = "/inference/v1/generate"
UPDATE_WEIGHT_VERSION = "/update_weight_version"
# freeze requests between steps and queue new ones; clear_cache (the route's default: true)
# would preempt the frozen requests (EngineCore._finish_pause -> _reset_caches with
# reset_running_requests), so they would be prefilled again on the new weights: KV not kept
PAUSE_KEEP = "/pause?mode=keep&clear_cache=false"
OPENAPI = "/openapi.json"
LABEL_ROUTES = (GENERATE, UPDATE_WEIGHT_VERSION, "/pause")
REASONS = ("stop", "length", "abort")


def offers_labels(openapi: Any) -> bool:
    """Whether an `/openapi.json` answer lists the generate, label and pause routes."""
    paths = openapi.get("paths") if isinstance(openapi, Mapping) else None
    return isinstance(paths, Mapping) and all(route in paths for route in LABEL_ROUTES)


def probe_request(model: str) -> dict[str, Any]:
    """A one-token generate request whose answer shows whether the server labels tokens."""
    return generate_request(
        model, [0], SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=1), seed=0
    )


def answers_labels(body: Any) -> bool:
    """Whether a generate answer's choice carries `weight_versions` spans (vLLM 0.32+; 0.28
    has the route, and the label routes, but its choices have no such field)."""
    try:
        return isinstance(body["choices"][0]["weight_versions"], list)
    except (KeyError, IndexError, TypeError):
        return False


def generate_request(
    model: str, prompt: Sequence[int], params: SamplingParams, *, seed: int | None = None
) -> dict[str, Any]:
    """The generate body for one token-id prompt: its `sampling_params` are vLLM's
    `SamplingParams` fields, the same the in-process engine sends (every field explicit,
    neutral penalties, one log-prob: the sampled token's, no detokenizing)."""
    sampling = vllm_sampling_kwargs(params, seed=seed)  # the in-process engine's fields
    return {
        "model": model,
        "token_ids": [int(t) for t in prompt],
        "sampling_params": sampling,
        "stream": False,
        "output_mode": "tokens",
    }


def parse_generate(body: Any) -> Completion:
    """Client side: the one choice of a generate answer, each token's version from vLLM's
    spans (MalformedResponse unless ids, finite log-probs <= 0 and spans tile the output)."""
    try:
        choices = body["choices"]
        if not isinstance(choices, list) or len(choices) != 1:
            raise MalformedResponse(f"expected one choice, got {choices!r:.200}")
        choice = choices[0]
        tokens = _ids(choice["token_ids"])
        log_probs = _log_probs(choice["logprobs"], tokens)
        versions = _versions(choice.get("weight_versions"), len(tokens))
        reason = choice["finish_reason"]
    except (KeyError, TypeError, AttributeError) as exc:
        raise MalformedResponse(f"generate answer lacks a field: {exc!r}") from exc
    if reason not in REASONS:
        raise MalformedResponse(f"finish_reason must be stop|length|abort, got {reason!r}")
    if not tokens and reason != "abort":
        raise MalformedResponse("the answer has no sampled token")
    return Completion(tokens, log_probs, versions, reason)


def _versions(spans: Any, n: int) -> list[int]:
    """Each token's version from the choice's `weight_versions` spans
    (frlab.rollout.weight_modes.span_versions; MalformedResponse unless they tile the output
    with frlab's versions)."""
    try:
        return span_versions(spans, n, lambda span: (span["version"], span["start"], span["end"]))
    except MalformedResponse:
        raise
    except ValueError as exc:
        raise MalformedResponse(f"weight_versions: {exc}") from exc


def label_request(version: int) -> dict[str, str]:
    """The `/update_weight_version` body: frlab's integer version as vLLM's string label."""
    return {"new_version": str(int(version))}


def label_set(body: Any, version: int) -> bool:
    """Whether an `/update_weight_version` answer confirms the label `str(version)`."""
    if not isinstance(body, Mapping):
        raise MalformedResponse(f"/update_weight_version answered {body!r:.200}")
    return body.get("success") is True and body.get("new_version") == str(int(version))


def _ids(ids: Any) -> list[int]:
    if not isinstance(ids, list) or not all(is_int(t) and t >= 0 for t in ids):
        raise MalformedResponse(f"token_ids must be a list of ids, got {ids!r:.200}")
    return list(ids)


def _log_probs(logprobs: Any, tokens: list[int]) -> list[float]:
    """The sampled tokens' log-probs from `logprobs.content` (one entry per output token)."""
    content = [] if logprobs is None and not tokens else logprobs["content"]
    if not isinstance(content, list) or len(content) != len(tokens):
        raise MalformedResponse(f"logprobs.content must hold {len(tokens)} entries")
    out = []
    for i, (entry, token) in enumerate(zip(content, tokens, strict=True)):
        value = entry["logprob"]
        if entry["token_id"] != token:
            raise MalformedResponse(f"logprobs.content[{i}] is for token {entry['token_id']}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MalformedResponse(f"logprobs.content[{i}] = {value!r} is not a number")
        if not math.isfinite(value) or value > 0 or value == -9999.0:  # -9999: vLLM's sentinel
            raise MalformedResponse(f"logprobs.content[{i}] = {value!r} is not a log-probability")
        out.append(float(value))
    return out
