"""A vLLM-like server whose completions take time and that honours vLLM's dev-mode pause.

`PausingVllmServer` extends `FakeVllmServer` (helpers.nccl: admission, snapshot loads through
frlab's worker extension, vLLM's router rules) with what a resubmit weight update uses, as
vLLM 0.32 does it (read from `vllm/entrypoints/rl/online/api_router.py`, `AsyncLLM.
pause_generation`, `EngineCore.pause_scheduler`, `OutputProcessor.abort_requests`, and the
non-streaming completion path of `vllm/entrypoints/openai/completion/serving.py`; the
`vllm_contract` tier checks the routes and the aborted answer against vLLM's own app):

- a completion samples one token every `step_s` (token `(last + 1) % 64`, log-prob -0.5) and
  records the weight version its workers held when it sampled each (`truth`);
- `POST /pause?mode=abort` ends every request it holds: each answers with its tokens so far
  and `finish_reason: "abort"` (no `frlab_versions`: vLLM sends none); until `POST /resume`
  new requests are queued (they sample nothing);
- `POST /abort_requests {}` ends every request it holds the same way (queued ones too);
- `down` (FakeVllmServer's switch) also fails a request it held when that ends (HTTP 500);
- `arrival_s`: a request reaches the engine that long after the server received it (one sent
  just before a pause arrives after it, and is queued).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from frlab.rollout.remote import protocol as proto
from helpers.nccl import FakeVllmServer

VOCAB = 64


@dataclass(eq=False)
class Held:
    """One completion request the fake is serving."""

    prompt: list[int]
    max_tokens: int
    tokens: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the workers' version at each token
    aborted: bool = False


class PausingVllmServer(FakeVllmServer):
    """FakeVllmServer with timed generation and vLLM's `/pause`, `/resume`, `/abort_requests`."""

    def __init__(self, step_s: float = 0.02, n_workers: int = 1, arrival_s: float = 0.0) -> None:
        super().__init__(n_workers=n_workers)
        self.step_s = step_s
        self.arrival_s = arrival_s  # a request reaches the engine this long after it is sent
        self.cond = threading.Condition()
        self.paused = False
        self.held: list[Held] = []
        self.received: list[tuple[list[int], int]] = []  # (prompt, max_tokens) per completion
        self.finished: list[Held] = []
        self.pauses: list[str] = []  # the path of every pause / resume / abort call

    def post(self, path: str, body: dict[str, Any]) -> Any:
        route = path.split("?", 1)[0]
        if route == proto.COMPLETIONS:
            return self.complete(list(body["prompt"]), int(body["max_tokens"]), body.get("model"))
        if route in ("/pause", proto.RESUME, proto.ABORT_REQUESTS):
            return self.control(path, route)
        return super().post(path, body)

    def control(self, path: str, route: str) -> dict[str, Any]:
        """vLLM's answers: {"status": "paused" | "resumed" | "aborted", ...}."""
        self.pauses.append(path)
        with self.cond:
            if route == "/pause":
                if path != proto.PAUSE_ABORT:
                    raise ValueError(f"this fake pauses with mode=abort only, got {path}")
                self.paused = True
            if route == proto.RESUME:
                self.paused = False
                self.cond.notify_all()
                return {"status": "resumed"}
            for held in self.held:
                held.aborted = True
            self.cond.notify_all()
            count = len(self.held)
        if route == "/pause":
            time.sleep(0.02)  # AsyncLLM.pause_generation: abort outputs go out first
            return {"status": "paused"}
        return {"status": "aborted", "aborted": count}

    def version_now(self, model: str | None = None) -> int:
        """The version of the weights that sample for `model` now (the workers')."""
        return int(self.workers[0].frlab_weight_version()["version"] or 0)

    def complete(
        self, prompt: list[int], max_tokens: int, model: str | None = None
    ) -> dict[str, Any]:
        """Sample one token per step until the budget is spent or the request is aborted."""
        time.sleep(self.arrival_s)
        held = Held(prompt, max_tokens)
        with self.cond:
            self.received.append((prompt, max_tokens))
            self.held.append(held)
        try:
            while len(held.tokens) < max_tokens and not held.aborted:
                with self.cond:
                    self.cond.wait(self.step_s)
                    if held.aborted or self.paused:
                        continue
                    last = held.tokens[-1] if held.tokens else prompt[-1]
                    held.tokens.append((last + 1) % VOCAB)
                    held.versions.append(self.version_now(model))
        finally:
            with self.cond:
                self.held.remove(held)
                self.finished.append(held)
        if self.down:  # a server that died while it held the request: HTTP 500
            raise RuntimeError("the server went down during the request")
        reason = "length" if len(held.tokens) >= max_tokens else "abort"
        answer = proto.completion_response(
            "fake",
            prompt,
            held.tokens,
            [-0.5] * len(held.tokens),
            held.versions,
            reason,
            "cmpl-fake",
        )
        del answer["choices"][0][proto.VERSIONS_FIELD]  # vLLM sends no versions
        return answer

    def in_progress(self) -> int:
        """Tokens sampled so far by the requests it holds."""
        with self.cond:
            return sum(len(h.tokens) for h in self.held)
