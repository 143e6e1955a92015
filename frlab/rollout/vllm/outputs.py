"""What frlab reads from a vLLM completion: the sampled tokens' log-probs (processed: of the
distribution sampled from), the finish reason, and each token's weight version from vLLM's
own version spans (`CompletionOutput.weight_versions`, vLLM 0.32+: spans `[start, end)` of
output tokens labelled with the version the engine was told, `update_weight_version`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from frlab.rollout.engine import EngineError, GenerationResult


def _logprob_value(entry: Any) -> float:
    """A vLLM `Logprob` object (`.logprob`) or a bare float."""
    return float(getattr(entry, "logprob", entry))


def sampled_log_probs(token_ids: Sequence[int], logprobs: Sequence[Any] | None) -> list[float]:
    """The log-prob vLLM reported for each sampled token (position i: `logprobs[i][token_ids[i]]`)."""
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


def generation_result(completion: Any, versions: Sequence[int]) -> GenerationResult:
    """A `GenerationResult` from a finished vLLM `CompletionOutput`."""
    token_ids = [int(t) for t in completion.token_ids]
    reason = completion.finish_reason
    if reason not in ("stop", "length"):
        raise EngineError(f"vLLM request ended with finish_reason={reason!r}")
    return GenerationResult(
        token_ids=token_ids,
        log_probs=sampled_log_probs(token_ids, completion.logprobs),
        versions=[int(v) for v in versions],
        finish_reason=reason,
    )


def span_versions(spans: Sequence[Any] | None, n: int) -> list[int]:
    """One int version per output token from vLLM's weight-version spans (EngineError when
    they are missing, not frlab's integer labels, or do not tile the `n` tokens exactly)."""
    if spans is None:
        raise EngineError("vLLM returned no weight-version spans for the request's tokens")
    out: list[int] = []
    for span in spans:
        start, end = int(span.start), int(span.end)
        try:
            version = int(span.version)
        except (TypeError, ValueError) as exc:
            raise EngineError(f"vLLM labelled tokens with version {span.version!r}") from exc
        if start != len(out) or end < start:
            raise EngineError(f"vLLM's weight-version spans do not tile the output: {spans}")
        out += [version] * (end - start)
    if len(out) != n:
        raise EngineError(f"vLLM's weight-version spans cover {len(out)} of {n} tokens")
    return out
