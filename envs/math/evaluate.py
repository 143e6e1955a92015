"""avg@k accuracy on math benchmarks (the FlashREINFORCE paper's evaluation metric).

avg@k of a benchmark = mean over its problems of the fraction of k sampled replies graded
correct (1/N sum_i 1/k sum_j grade(reply_ij, answer_i)): an unbiased estimate of the expected
single-sample accuracy; the paper reports avg@32 (AIME, temp 0.6, top_p 0.95), avg@4 and
avg@16 (temp 0.7, top_p 0.7). Sampling settings belong to the caller's `generate`.

`evaluate_avg_at_k` is engine-agnostic: `generate` maps a list of chat prompts (each a list
of {role, content} messages) to one sampled reply per prompt; each problem is asked k times
in one call. Prompts follow the math env's templates (`envs.math.env.prompt_messages`;
`messages` sends a benchmark's own chat messages, e.g. the AIME files of the
sail/Sanity-Test-R1D-1.5B test split). Grading runs in a thread pool (envs.math.grade is
thread-safe), reading answers in `answer_format` (any | boxed | final_line, envs.math.extract).
Each benchmark also gets its standard error, `{prefix}/{benchmark}/avg@{k}_se`: the sample
standard deviation of the per-problem accuracies over sqrt(number of problems) (0 for a single
problem).
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envs.math.env import MESSAGES, prompt_messages, resolve_template
from envs.math.grading import grade

Generate = Callable[[list[list[dict[str, str]]]], Sequence[str]]


def _grade_all(
    replies: Sequence[str],
    answers: Sequence[str],
    timeout_s: float,
    max_workers: int,
    answer_format: str,
) -> list[float]:
    def one(pair: tuple[str, str]) -> float:
        return grade(pair[0], pair[1], timeout_s=timeout_s, answer_format=answer_format)

    with concurrent.futures.ThreadPoolExecutor(max_workers) as pool:
        return list(pool.map(one, zip(replies, answers, strict=True)))


def standard_error(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1) of `values` over sqrt(n); 0.0 for fewer than 2."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def problem_accuracies(
    generate: Generate,
    problems: Sequence[Mapping[str, Any]],
    k: int,
    *,
    template: str = "instruct",
    timeout_s: float = 5.0,
    max_workers: int = 4,
    answer_format: str = "any",
) -> list[float]:
    """Per problem, the fraction of its k sampled replies graded correct."""
    if isinstance(k, bool) or int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k!r}")
    if len(problems) == 0:
        raise ValueError("benchmark has no problems")
    if template != MESSAGES:
        resolve_template(template)  # a bad template fails before any generation
    prompts, answers = [], []
    for problem in problems:
        messages = prompt_messages(template, problem)
        for _ in range(int(k)):
            prompts.append([dict(m) for m in messages])
            answers.append(str(problem["answer"]))
    replies = list(generate(prompts))
    if len(replies) != len(prompts):
        raise ValueError(f"generate returned {len(replies)} replies for {len(prompts)} prompts")
    scores = _grade_all(replies, answers, timeout_s, max_workers, answer_format)
    k = int(k)
    return [sum(scores[i : i + k]) / k for i in range(0, len(scores), k)]


def benchmark_avg_at_k(
    generate: Generate, problems: Sequence[Mapping[str, Any]], k: int, **grading: Any
) -> float:
    """avg@k of one benchmark (a sequence of {question, answer} tasks); `grading`: the
    keyword arguments of `problem_accuracies`."""
    accuracies = problem_accuracies(generate, problems, k, **grading)
    return sum(accuracies) / len(accuracies)


def evaluate_avg_at_k(
    generate: Generate,
    benchmarks: Mapping[str, Sequence[Mapping[str, Any]]],
    k: int,
    *,
    template: str = "instruct",
    timeout_s: float = 5.0,
    max_workers: int = 4,
    prefix: str = "eval",
    answer_format: str = "any",
) -> dict[str, float]:
    """avg@k per benchmark with its standard error and the benchmarks' unweighted mean, as
    metrics `{prefix}/{benchmark}/avg@{k}`, `{prefix}/{benchmark}/avg@{k}_se` and
    `{prefix}/mean/avg@{k}` (ready for a logger)."""
    if not benchmarks:
        raise ValueError("evaluate_avg_at_k needs at least one benchmark")
    metrics: dict[str, float] = {}
    for name, problems in benchmarks.items():
        accuracies = problem_accuracies(
            generate,
            problems,
            k,
            template=template,
            timeout_s=timeout_s,
            max_workers=max_workers,
            answer_format=answer_format,
        )
        metrics[f"{prefix}/{name}/avg@{k}"] = sum(accuracies) / len(accuracies)
        metrics[f"{prefix}/{name}/avg@{k}_se"] = standard_error(accuracies)
    means = [metrics[f"{prefix}/{name}/avg@{k}"] for name in benchmarks]
    metrics[f"{prefix}/mean/avg@{k}"] = sum(means) / len(means)
    return metrics
