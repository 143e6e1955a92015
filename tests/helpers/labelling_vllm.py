"""A vLLM-like server that labels each token's weight version, as vLLM 0.32 run with
`--enable-scale-out` and dev mode does (read from its wheel: frlab.rollout.remote.generate's
docstring; the `vllm_contract` tier checks these answers against vLLM's own app):

- `GET /openapi.json` lists `/inference/v1/generate`, `/update_weight_version` and `/pause`;
- `POST /update_weight_version {"new_version"}` sets the label (initially "default", as vLLM's
  engine core) and answers `{"success": true, "new_version"}`;
- `POST /inference/v1/generate` samples as `PausingVllmServer` (one token per `step_s`), each
  token labelled with the label held when it was sampled; the answer carries the spans (the
  client's one-token label probe is answered at once and only counted, `probes`);
- `POST /pause?mode=keep&clear_cache=false` freezes every request it holds (no token until
  `/resume`, nothing aborted; another keep-pause, which would clear the KV, fails);
  mode=abort, `/resume` and `/abort_requests` as `PausingVllmServer`.

`label_offset` adds to every label it answers (a server that mislabels tokens). `hold_at`:
a request stops after that many tokens until the first keep-pause arrives (an update lands
inside it however slow the machine is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from frlab.rollout.remote import generate as gen
from helpers.pausing_vllm import VOCAB, Held, PausingVllmServer


class LabellingVllmServer(PausingVllmServer):
    """PausingVllmServer with vLLM's weight-version labels, generate endpoint and keep-pause."""

    def __init__(self, step_s: float = 0.02, n_workers: int = 1) -> None:
        super().__init__(step_s=step_s, n_workers=n_workers)
        self.label = "default"  # vLLM's EngineCore._weight_version before any update
        self.label_offset = 0
        self.generated: list[Held] = []  # every generate request it received
        self.probes = 0  # the client's one-token label probes (answered at once)
        self.hold_at: int | None = None  # tokens after which a request waits for a keep-pause

    def get(self, path: str) -> Any:
        if path == gen.OPENAPI:
            routes = ["/v1/completions", "/health", "/resume", *gen.LABEL_ROUTES]
            return {"openapi": "3.1.0", "paths": {r: {"post": {}} for r in routes}}
        return super().get(path)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        if path == gen.UPDATE_WEIGHT_VERSION:
            self.pauses.append(path)
            with self.cond:
                self.label = str(body["new_version"])
            return {"success": True, "new_version": self.label}
        if path == gen.GENERATE and body == gen.probe_request(body["model"]):
            self.probes += 1  # the client's label probe: one token, not counted below
            return self.answer([0], Held([0], 1, [1]), [self.label], "length")
        if path == gen.GENERATE:
            sampling = body["sampling_params"]
            return self.generate(list(body["token_ids"]), int(sampling["max_tokens"]))
        if path == gen.PAUSE_KEEP:
            self.pauses.append(path)
            with self.cond:
                self.paused = True
            return {"status": "paused"}
        return super().post(path, body)

    def generate(self, prompt: list[int], max_tokens: int) -> dict[str, Any]:
        """Sample one labelled token per step until the budget is spent or it is aborted."""
        held = Held(prompt, max_tokens)
        labels: list[str] = []
        with self.cond:
            self.received.append((prompt, max_tokens))
            self.held.append(held)
            self.generated.append(held)
        try:
            while len(held.tokens) < max_tokens and not held.aborted:
                with self.cond:
                    self.cond.wait(self.step_s)
                    if held.aborted or self.paused or self.holds(held):
                        continue
                    last = held.tokens[-1] if held.tokens else prompt[-1]
                    held.tokens.append((last + 1) % VOCAB)
                    held.versions.append(self.version_now())
                    labels.append(self.label)
        finally:
            with self.cond:
                self.held.remove(held)
                self.finished.append(held)
        if self.down:
            raise RuntimeError("the server went down during the request")
        reason = "length" if len(held.tokens) >= max_tokens else "abort"
        return self.answer(prompt, held, labels, reason)

    def holds(self, held: Held) -> bool:
        """Whether `held` waits at `hold_at` tokens for the first keep-pause."""
        kept = gen.PAUSE_KEEP in self.pauses
        return self.hold_at is not None and not kept and len(held.tokens) >= self.hold_at

    def answer(self, prompt: list[int], held: Held, labels: list[str], reason: str) -> Any:
        """vLLM's generate answer; labels as spans (with `label_offset` added)."""
        n = len(held.tokens)
        out = generate_response(prompt, held.tokens, [-0.5] * n, [0] * n, reason, "fake")
        spans: list[dict[str, Any]] = []
        for i, label in enumerate(labels):
            shown = str(int(label) + self.label_offset) if label.isdigit() else label
            if spans and spans[-1]["version"] == shown:
                spans[-1]["end"] = i + 1
            else:
                spans.append({"version": shown, "start": i, "end": i + 1})
        out["choices"][0]["weight_versions"] = spans
        return out


def generate_response(
    prompt: Sequence[int],
    token_ids: Sequence[int],
    log_probs: Sequence[float],
    versions: Sequence[int],
    finish_reason: str,
    request_id: str,
) -> dict[str, Any]:
    """A generate answer shaped as vLLM 0.32's (frlab.rollout.remote.generate's docstring), the
    per-token `versions` as spans."""
    content = [
        {
            "token_id": int(t),
            "logprob": float(x),
            "rank": 1,
            "top_logprobs": [{"token_id": int(t), "logprob": float(x), "rank": 1}],
        }
        for t, x in zip(token_ids, log_probs, strict=True)
    ]
    choice = {
        "index": 0,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": [int(t) for t in token_ids],
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": version_spans(versions),
        "logprobs": {"content": content},
    }
    usage = {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(token_ids),
        "total_tokens": len(prompt) + len(token_ids),
    }
    return {
        "request_id": request_id,
        "model": None,
        "created": 0,
        "usage": usage,
        "choices": [choice],
        "prompt_token_ids": None,
    }


def version_spans(versions: Sequence[int]) -> list[dict[str, Any]]:
    """Per-token versions as vLLM's contiguous spans (`[]` for no token)."""
    spans: list[dict[str, Any]] = []
    for i, version in enumerate(versions):
        if spans and spans[-1]["version"] == str(int(version)):
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": str(int(version)), "start": i, "end": i + 1})
    return spans
