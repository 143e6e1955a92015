"""What frlab reads from a vLLM completion: the sampled tokens' log-probs (processed: of the
distribution sampled from), the finish reason, and each token's weight version from vLLM's
own version spans (`CompletionOutput.weight_versions`, vLLM 0.32+: spans `[start, end)` of
output tokens labelled with the version the engine was told, `update_weight_version`; read by
frlab.rollout.weight_modes.span_versions, as the remote engine reads them over HTTP)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from frlab.rollout.engine import EngineError
from frlab.rollout.weight_modes import Fragment, span_versions


def _logprob_value(entry: Any) -> float:
    """A vLLM `Logprob` object (`.logprob`) or a bare float."""
    return float(getattr(entry, "logprob", entry))


def sampled_log_probs(token_ids: Sequence[int], logprobs: Sequence[Any] | None) -> list[float]:
    """The log-prob vLLM reported for each sampled token (position i:
    `logprobs[i][token_ids[i]]`)."""
    if logprobs is None:
        raise EngineError("vLLM returned no logprobs: the request must set logprobs=1")
    if len(logprobs) != len(token_ids):
        raise EngineError(
            f"vLLM returned {len(logprobs)} logprob entries for {len(token_ids)} tokens"
        )
    out = []
    for i, (tok, entry) in enumerate(zip(token_ids, logprobs, strict=True)):
        try:
            value = _logprob_value(entry[int(tok)])
        except (KeyError, IndexError, TypeError) as exc:
            raise EngineError(
                f"vLLM logprobs at position {i} lack the sampled token {tok}"
            ) from exc
        if not value <= 0.0:
            raise EngineError(f"vLLM log-prob {value} at position {i} is not a log-probability")
        out.append(value)
    return out


def fragment(completion: Any, versions: Sequence[int]) -> Fragment:
    """A finished vLLM `CompletionOutput` as one fragment of its request (an aborted one:
    its tokens so far); EngineError for a finish reason other than stop, length or abort."""
    token_ids = [int(t) for t in completion.token_ids]
    reason = completion.finish_reason
    if reason not in ("stop", "length", "abort"):
        raise EngineError(f"vLLM request ended with finish_reason={reason!r}")
    log_probs = sampled_log_probs(token_ids, completion.logprobs)
    return Fragment(token_ids, log_probs, [int(v) for v in versions], reason)


def token_versions(spans: Sequence[Any] | None, n: int) -> list[int]:
    """One int version per output token from vLLM's `WeightVersionSpan`s (`version`, `start`,
    `end`; frlab.rollout.weight_modes.span_versions), EngineError when they do not label the
    `n` tokens with frlab's versions exactly."""
    try:
        return span_versions(spans, n, lambda span: (span.version, span.start, span.end))
    except (ValueError, AttributeError) as exc:
        raise EngineError(f"vLLM's token versions: {exc}") from exc
