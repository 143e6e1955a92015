"""Single-turn math with a verifiable 0/1 reward.

Public entry points: `grade(response, ground_truth) -> float` (answer extraction, string
match, then math-verify in worker processes: safe from rollout threads), `extract_answer`,
`MathEnv` (the environment), `load_math_dataset` (local JSONL/parquet, Hugging Face ids,
offline package sources), `evaluate_avg_at_k` (avg@k per benchmark). math-verify (extra `math`) and the data packages (extra `data`) are
imported only when used.
"""

from envs.math.datasets import MathDataset, load_math_dataset
from envs.math.env import TEMPLATES, MathEnv
from envs.math.evaluate import benchmark_avg_at_k, evaluate_avg_at_k
from envs.math.extract import extract_answer
from envs.math.grading import answers_match, grade, ground_truth_text

__all__ = [
    "TEMPLATES",
    "MathDataset",
    "MathEnv",
    "answers_match",
    "benchmark_avg_at_k",
    "evaluate_avg_at_k",
    "extract_answer",
    "grade",
    "ground_truth_text",
    "load_math_dataset",
]
