"""avg@k evaluation: per-benchmark mean of per-problem sample accuracy, and their mean."""

from __future__ import annotations

from collections import Counter

import pytest

from envs.math import TEMPLATES
from envs.math.evaluate import benchmark_avg_at_k, evaluate_avg_at_k

EASY = [{"question": "1 + 1?", "answer": "2"}, {"question": "2 + 2?", "answer": "4"}]
HARD = [{"question": "7 * 6?", "answer": "42"}]


class ScriptedPolicy:
    """Always right on "1 + 1?", right on every other sample of "2 + 2?", always wrong
    on anything else; records the prompts it saw."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    def __call__(self, prompts: list[list[dict[str, str]]]) -> list[str]:
        replies = []
        for messages in prompts:
            content = messages[-1]["content"]
            self.seen[content] += 1
            if "1 + 1?" in content:
                replies.append("so \\boxed{2}")
            elif "2 + 2?" in content:
                replies.append("\\boxed{4}" if self.seen[content] % 2 else "\\boxed{5}")
            else:
                replies.append("I think 41")
        return replies


def test_avg_at_k_per_benchmark_and_mean() -> None:
    policy = ScriptedPolicy()
    metrics = evaluate_avg_at_k(policy, {"easy": EASY, "hard": HARD}, k=4)
    assert metrics == {
        "eval/easy/avg@4": pytest.approx(0.75),  # (1 + 0.5) / 2
        "eval/easy/avg@4_se": pytest.approx(0.25),  # sqrt(((1/4)^2 * 2) / 1 / 2)
        "eval/hard/avg@4": 0.0,
        "eval/hard/avg@4_se": 0.0,
        "eval/mean/avg@4": pytest.approx(0.375),
    }
    prompt = TEMPLATES["instruct"].format(question="2 + 2?")
    assert policy.seen[prompt] == 4 and len(policy.seen) == 3


def test_template_and_prefix_are_applied() -> None:
    policy = ScriptedPolicy()
    metrics = evaluate_avg_at_k(policy, {"easy": EASY}, k=2, template="Q: {question}", prefix="val")
    assert set(policy.seen) == {"Q: 1 + 1?", "Q: 2 + 2?"}
    assert metrics["val/easy/avg@2"] == pytest.approx(0.75)


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="k must be"):
        benchmark_avg_at_k(ScriptedPolicy(), EASY, k=0)
    with pytest.raises(ValueError, match="no problems"):
        benchmark_avg_at_k(ScriptedPolicy(), [], k=1)
    with pytest.raises(ValueError, match="1 replies for 2 prompts"):
        benchmark_avg_at_k(lambda prompts: ["x"], EASY, k=1)
    with pytest.raises(ValueError, match="at least one benchmark"):
        evaluate_avg_at_k(ScriptedPolicy(), {}, k=1)
