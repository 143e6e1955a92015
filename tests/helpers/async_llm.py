"""A fake of vLLM's in-process `AsyncLLM` for the `vllm` engine tests, answering as vLLM
0.28/0.29 does (rules read from its sources; tests/vllm_contract checks `msgspec_transport`
against vLLM's own serialiser).

- `msgspec_transport(value)` (tests/helpers/vllm_worker.py): what `collective_rpc`
  arguments look like in the engine-core process.
- `FakeAsyncLLM`: `from_engine_args`, `generate` (a scripted stream), `collective_rpc` by
  method name through that transport to two workers carrying frlab's worker extension (with
  `Worker.reload_weights`), `reset_prefix_cache` -> bool, `vllm_config.model_config
  .logprobs_mode` from the engine arguments;
- `LabellingAsyncLLM`: the same with vLLM 0.32's token version labels, pause and resume (the
  engine then offers in_flight and resubmit).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from types import SimpleNamespace
from typing import Any, ClassVar

from frlab.rollout.vllm.worker_extension import WORKER_EXTENSION_CLS
from helpers.vllm_worker import FakeWorker, msgspec_transport  # noqa: F401 (re-exported)


def completion(tokens: list[int], reason: str | None) -> SimpleNamespace:
    logprobs = [{t: SimpleNamespace(logprob=-0.1 * (i + 1))} for i, t in enumerate(tokens)]
    return SimpleNamespace(token_ids=tokens, logprobs=logprobs, finish_reason=reason)


class FakeAsyncLLM:
    """See the module docstring; `instances` holds every engine built."""

    instances: ClassVar[list[FakeAsyncLLM]] = []
    served_mode: ClassVar[str | None] = None  # None: report the mode it was built with

    @dataclasses.dataclass
    class Args:
        model: str
        seed: int = 0
        logprobs_mode: str = "raw_logprobs"
        generation_config: str = "auto"
        worker_extension_cls: str = ""
        tensor_parallel_size: int = 1
        skip_tokenizer_init: bool = False

    def __init__(self, args: FakeAsyncLLM.Args) -> None:
        self.args, self.shut, self.rpc_calls, self.events = args, False, [], []
        self.workers = [FakeWorker(), FakeWorker()]  # two tensor-parallel ranks
        self.release: threading.Event | None = None  # when set, requests wait for it
        self.corrupt = False
        self.reset_answer: Any = True
        self.hang_rpc = False  # collective_rpc never returns (its engine core was killed)
        self.dead_error: Exception | None = None  # AsyncLLM.dead_error once the core is gone
        self.visible_at_start = os.environ.get("CUDA_VISIBLE_DEVICES")
        mode = self.served_mode or args.logprobs_mode
        self.vllm_config = SimpleNamespace(model_config=SimpleNamespace(logprobs_mode=mode))
        FakeAsyncLLM.instances.append(self)

    @property
    def errored(self) -> bool:
        """AsyncLLM.errored: its engine core died (the output handler saw EngineDeadError)."""
        return self.dead_error is not None

    @classmethod
    def from_engine_args(cls, args: FakeAsyncLLM.Args) -> FakeAsyncLLM:
        assert args.worker_extension_cls == WORKER_EXTENSION_CLS
        return cls(args)

    async def generate(self, prompt: Any, sampling: Any, request_id: str) -> Any:
        tokens = []
        self.events.append(("start", request_id))
        for step in range(sampling["max_tokens"]):
            tokens.append(prompt["prompt_token_ids"][-1] + step + 1)
            await asyncio.sleep(0)
            while step == 0 and self.release is not None and not self.release.is_set():
                await asyncio.sleep(0.001)
            done = step == sampling["max_tokens"] - 1
            yield SimpleNamespace(outputs=[completion(list(tokens), "length" if done else None)])
        self.events.append(("finish", request_id))

    async def collective_rpc(
        self, method: Any, timeout: float | None = None, args: tuple = (), kwargs: Any = None
    ) -> list[Any]:
        if not isinstance(method, str):  # V1 refuses callables without insecure serialisation
            raise TypeError("collective_rpc callables need VLLM_ALLOW_INSECURE_SERIALIZATION=1")
        self.rpc_calls.append((method, args))
        self.events.append(("rpc", method))
        while self.hang_rpc:
            await asyncio.sleep(0.01)
        sent = msgspec_transport(args)
        acks = [getattr(w, method)(*sent, **(kwargs or {})) for w in self.workers]
        if self.corrupt:
            acks = [{**a, "sum": a["sum"] + 1.0} for a in acks]
        return acks

    async def reset_prefix_cache(self) -> Any:
        self.events.append(("reset", None))
        return self.reset_answer

    def shutdown(self) -> None:
        self.shut = True


@dataclasses.dataclass
class CompletionOutput:
    """The fields of vLLM 0.32's `CompletionOutput` frlab reads, `weight_versions` included
    (the engine offers every weight-update mode only where that field exists)."""

    token_ids: list[int]
    logprobs: Any
    finish_reason: str | None
    weight_versions: Any = None


class LabellingAsyncLLM(FakeAsyncLLM):
    """FakeAsyncLLM answering as vLLM 0.32 does with version labels: each token carries the
    label held when it was sampled (`update_weight_version`, spans of `SimpleNamespace(version,
    start, end)` as vLLM's `WeightVersionSpan`); `pause_generation(mode="keep"|"abort")` and
    `resume_generation`. A request samples `script` (the first request only; then the
    context's last id + 1, + 2, ...) and ends on a stop token or its budget. With `hold_at=k`
    the first request waits after its k-th token until a pause with abort, which ends it with
    its tokens so far, whatever the last one is (`received`: each request's context, budget
    and seed)."""

    def __init__(self, args: FakeAsyncLLM.Args) -> None:
        super().__init__(args)
        self.label = "default"  # vLLM's label before any update_weight_version
        self.script: list[int] | None = None
        self.hold_at: int | None = None
        self.held = self.aborting = False
        self.pauses: list[str] = []
        self.received: list[tuple[list[int], int, int | None]] = []

    async def update_weight_version(self, version: str) -> None:
        self.label = version

    async def pause_generation(self, mode: str = "abort", clear_cache: bool = True) -> None:
        self.pauses.append(mode)
        self.aborting = mode == "abort"
        while self.aborting and self.held:  # the held request has answered its abort
            await asyncio.sleep(0.001)

    async def resume_generation(self) -> None:
        self.pauses.append("resume")
        self.aborting = False

    async def generate(self, prompt: Any, sampling: Any, request_id: str, **kw: Any) -> Any:
        context = list(prompt["prompt_token_ids"])
        script, self.script = self.script, None
        self.received.append((context, sampling["max_tokens"], sampling.get("seed")))
        tokens: list[int] = []
        labels: list[str] = []
        for step in range(sampling["max_tokens"]):
            tokens.append(script[step] if script else context[-1] + step + 1)
            labels.append(self.label)
            await asyncio.sleep(0)
            if self.hold_at == len(tokens):
                self.hold_at, self.held = None, True
                while not self.aborting:
                    await asyncio.sleep(0.001)
                self.held = False
                yield SimpleNamespace(outputs=[labelled(tokens, labels, "abort")])
                return
            if tokens[-1] in sampling["stop_token_ids"]:
                break
        reason = "stop" if tokens[-1] in sampling["stop_token_ids"] else "length"
        yield SimpleNamespace(outputs=[labelled(tokens, labels, reason)])


def labelled(tokens: list[int], labels: list[str], reason: str) -> CompletionOutput:
    """A finished output whose tokens carry `labels` as vLLM's contiguous spans."""
    spans: list[SimpleNamespace] = []
    for i, label in enumerate(labels):
        if spans and spans[-1].version == label:
            spans[-1].end = i + 1
        else:
            spans.append(SimpleNamespace(version=label, start=i, end=i + 1))
    out = completion(list(tokens), reason)
    return CompletionOutput(out.token_ids, out.logprobs, reason, spans)
