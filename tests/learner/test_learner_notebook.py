"""The extending guide's notebook snippet (docs/extending.md, "The learner from a notebook")
runs as written: it builds the learner from objects and steps it once on a toy batch."""

from __future__ import annotations

from pathlib import Path

import torch

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def snippet() -> str:
    text = GUIDE.read_text()
    block = text[
        text.index("<!-- learner-notebook:begin") : text.index("<!-- learner-notebook:end")
    ]
    return block.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_snippet_is_short() -> None:
    code = [
        line
        for line in snippet().splitlines()
        if line and not line.startswith(("import ", "from ", "#"))
    ]
    assert len(code) <= 10, code


def test_the_notebook_snippet_builds_and_steps_the_learner() -> None:
    namespace: dict = {}
    exec(compile(snippet(), str(GUIDE), "exec"), namespace)
    learner, batch = namespace["learner"], namespace["batch"]
    assert learner.trainer.global_step == 1
    metrics = learner.trainer.callback_metrics
    # the batch's behaviour log-probs are the policy's own: every trajectory admitted
    assert float(metrics["train/acceptance_rate"]) == 1.0
    assert float(metrics["train/sequence_kl_mean"]) < 1e-6
    assert float(metrics["train/reward_mean"]) == float(batch.rewards.mean())
    assert learner.objective is namespace["run"].objective
    assert learner.settings.batch_size == 8 and learner.settings.micro_batch_size == 4
    assert float(metrics["train/micro_batches"]) == 2.0
    assert torch.isfinite(metrics["train/loss"]) and float(metrics["train/grad_norm"]) > 0
    state = learner.trainer.optimizers[0].state  # one AdamW step taken on every parameter
    assert {int(s["step"]) for s in state.values()} == {1}
    assert len(state) == sum(1 for p in namespace["policy"].parameters() if p.requires_grad)
