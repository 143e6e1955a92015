"""`python -m frlab experiment=smollm2_arith_cpu`: a real pretrained model learns on a CPU.

The preset runs through the real entry point, shortened to UPDATES updates with a small
evaluation (the first 4 problems of each benchmark, 1 sample each), seed 0: SmolLM2-135M-
Instruct (the converted GGUF in the frlab cache; the first use fetches and converts it),
one-digit sums in the real chat template with SmolLM2's default system prompt, graded 0/1.

Learning, beyond noise: the mean batch reward of the last WINDOW updates exceeds that of the
first WINDOW by more than 3 standard errors of the difference (each window's standard error
from its batch means). With B 32 the batch-mean noise is about 0.09; the full preset goes from
about 0.3 to above 0.9 (experiments/2026-11-30_smollm2_arith). In the four recorded 30-update
runs (that one and the ablation study's three base seeds), the first 16 updates' windows of 8
gave 4.5 to 7.9 standard errors: a margin over 3 in 16 updates. The evaluation rows (step 0
and the last step) and the samples show the held-out design: no prompt of the run is a
held-out question.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="needs the gguf extra (pip install 'frlab[gguf]')")
pytest.importorskip("reasoning_gym", reason="needs the data extra (reasoning-gym)")

UPDATES, WINDOW = 16, 8
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HYDRA_FULL_ERROR": "1",
}
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
INSTRUCTION = "\nGive only the final answer as a number.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smollm2_arith") / "run"
    command = [
        sys.executable,
        "-m",
        "frlab",
        "experiment=smollm2_arith_cpu",
        "seed=0",
        f"trainer.max_steps={UPDATES}",
        "eval.limit=4",
        "eval.k=1",
        f"hydra.run.dir={out}",
    ]
    done = subprocess.run(
        command, cwd=out.parent, env=ENV, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.mark.slow
def test_the_batch_reward_rises_beyond_noise(run_dir: Path) -> None:
    from frlab.tracking import read_metrics

    rows = [r for r in read_metrics(run_dir / "metrics.csv") if r["step"] >= 1]
    assert [r["step"] for r in rows] == [float(s) for s in range(1, UPDATES + 1)]
    rewards = [r["train/reward_mean"] for r in rows]
    first, last = rewards[:WINDOW], rewards[-WINDOW:]
    se = math.sqrt(statistics.variance(first) / WINDOW + statistics.variance(last) / WINDOW)
    gain = statistics.mean(last) - statistics.mean(first)
    assert gain > 3 * se, f"first {first}, last {last}: gain {gain:.3f}, se {se:.3f}"
    assert all(math.isfinite(r["train/loss"]) and r["train/policy_lag_max"] <= 1 for r in rows)
    assert all(
        r["timing/generation_s"] > 0 and r["timing/generation_tokens_per_s"] > 0 for r in rows
    )


@pytest.mark.slow
def test_evaluation_before_and_after_lands_in_metrics_and_summary(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == UPDATES
    for name in ("heldout", "transfer"):
        point = summary["eval"][f"eval/{name}/avg@1"]
        assert (point["first_step"], point["last_step"]) == (0, UPDATES)
        assert 0.0 <= point["first"] <= 1.0 and 0.0 <= point["last"] <= 1.0
        assert f"eval/{name}/avg@1_se" in summary["eval"]


@pytest.mark.slow
def test_prompts_are_training_sums_in_the_real_chat_template(run_dir: Path) -> None:
    from transformers import AutoTokenizer

    from envs.math import load_math_dataset
    from frlab.model.gguf import resolve_model_source
    from frlab.rollout.chat import template_ids

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source("gguf:smollm2-135m-instruct"))
    options = {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+"],
        "allow_parentheses": False,
        "allow_negation": False,
    }
    heldout = {
        task["question"]
        for task in load_math_dataset(
            "reasoning-gym:basic_arithmetic",
            limit=2000,
            options=options,
            holdout={"fraction": 0.25, "part": "heldout"},
        )
    }
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * UPDATES
    for sample in samples:
        prompt = sample["prompt"]
        assert prompt.startswith(SYSTEM) and prompt.endswith(INSTRUCTION)
        question = prompt.split("<|im_start|>user\n")[1].split("\n")[0]
        assert question.startswith("Calculate ") and question not in heldout
        user = {"role": "user", "content": f"{question}\nGive only the final answer as a number."}
        assert sample["prompt_ids"] == template_ids(tokenizer, [user])
        assert sample["reward"] in (0.0, 1.0) and 0 < sample["policy_tokens"] <= 16
