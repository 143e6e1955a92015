"""Base rates of candidate tasks for SmolLM2-135M-Instruct before any training.

Each candidate is a reasoning-gym `basic_arithmetic` setting. Every problem (its first N
distinct questions) is asked once per repeat with the preset's prompt
("{question}\\nGive only the final answer as a number.", 16 new tokens, temperature 1,
top_p 1) on frlab's torch engine, and graded 0/1 by envs.math.grade in the default `any`
format and in the strict `final_line` format. `--system-prompt none` renders the prompts
without SmolLM2's default system turn.

    python experiments/2026-11-30_smollm2_arith/base_rates.py --problems 64 --repeats 2
    python experiments/2026-11-30_smollm2_arith/base_rates.py --only one_digit_add \\
        --problems 121 --repeats 2 --system-prompt none
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time

import torch

from frlab.defaults import sampling_params, torch_engine

SIMPLE = {"allow_parentheses": False, "allow_negation": False}
CANDIDATES = {
    "one_digit_add": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+"],
        **SIMPLE,
    },
    "one_digit_add_sub": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+", "-"],
        **SIMPLE,
    },
    "one_digit_mul": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["*"],
        **SIMPLE,
    },
    "one_two_digit_add": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 2,
        "operators": ["+"],
        **SIMPLE,
    },
    "three_term_add": {
        "min_terms": 3,
        "max_terms": 3,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+"],
        **SIMPLE,
    },
    "two_digit_add": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 2,
        "max_digits": 2,
        "operators": ["+"],
        **SIMPLE,
    },
}
TEMPLATE = "{question}\nGive only the final answer as a number."


def rate(scores: list[float]) -> tuple[float, float]:
    """Mean and its binomial standard error."""
    p = sum(scores) / len(scores)
    return p, math.sqrt(p * (1 - p) / len(scores))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--system-prompt", default="default")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from envs.math import grade, load_math_dataset
    from frlab.config.arguments import declared_arguments
    from frlab.config.schema import ModelConfig
    from frlab.model import build_policy
    from frlab.model.gguf import resolve_model_source
    from frlab.rollout.chat import template_ids

    path = resolve_model_source("gguf:smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = build_policy(**declared_arguments(ModelConfig, name_or_path=path), seed=0)
    engine = torch_engine(model, max_batch_size=64, seed=0)
    engine.start()
    stop = (tokenizer.eos_token_id,)
    params = sampling_params(temperature=1.0, top_p=1.0, max_new_tokens=16, stop_token_ids=stop)

    async def sample(prompts: list[list[int]]) -> list:
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    for name, options in CANDIDATES.items():
        if args.only and name not in args.only:
            continue
        generated = load_math_dataset(
            "reasoning-gym:basic_arithmetic", limit=2000, seed=0, options=options
        )
        distinct = list({t["question"]: t for t in generated}.values())
        tasks = distinct[: args.problems] * args.repeats
        messages = [
            [{"role": "user", "content": TEMPLATE.format(question=t["question"])}] for t in tasks
        ]
        prompts = [template_ids(tokenizer, m, args.system_prompt) for m in messages]
        start = time.perf_counter()
        results = asyncio.run(sample(prompts))
        seconds = time.perf_counter() - start
        replies = [tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in results]
        row = {
            "task": name,
            "samples": len(replies),
            "system_prompt": args.system_prompt,
            "seconds": round(seconds, 1),
        }
        for fmt in ("any", "final_line"):
            scores = [
                grade(r, t["answer"], answer_format=fmt)
                for r, t in zip(replies, tasks, strict=True)
            ]
            row[fmt], row[f"{fmt}_se"] = (round(x, 3) for x in rate(scores))
        print(json.dumps(row), flush=True)
    engine.shutdown()


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
