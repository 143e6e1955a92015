"""bench/gpu_mfu.py: the FLOP formula, the profile's arithmetic, and every part run on a CPU at
a tiny shape (what scripts/gpu_check.sh runs on a GPU at full shape)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
from helpers.bench import BENCH, load_bench

profile = load_bench("learner_profile")


def test_model_flops_of_one_sequence_by_hand() -> None:
    """d=4, ff=8, one layer, 2 heads of 2, 1 KV head, V=10: matmul params 4*4 + 2*4*2 + 4*4
    + 3*4*8 + 4*10 = 184; forward of n=3 tokens 2*184*3 + 2*9*4 = 1,176; x3 = 3,528."""
    cfg = {
        "hidden_size": 4,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 10,
    }
    assert profile.matmul_params(cfg) == 184
    assert profile.model_flops(cfg, [3]) == 3528.0
    assert profile.model_flops(cfg, [3, 3]) == 2 * 3528.0  # per sequence, not per row


def test_profile_other_is_the_step_minus_the_top_level_phases(monkeypatch) -> None:  # noqa: ANN001
    import contextlib

    from frlab.ops import phases

    spent = {
        "decoder_forward": 0.5,
        "attention_forward": 0.2,
        "lm_head_forward": 0.1,
        "objective": 0.05,
        "backward": 1.0,
        "lm_head_backward": 0.3,
        "attention_backward": 0.25,
        "optimizer": 0.15,
    }

    @contextlib.contextmanager
    def fake_profiling(device):  # noqa: ANN001, ANN202
        yield phases.Phases(device, seconds=dict(spent))

    monkeypatch.setattr(phases, "profiling", fake_profiling)
    seconds = profile.profile_update(lambda: {"timing/step_s": 2.0}, "cpu")
    assert seconds["other"] == pytest.approx(2.0 - (0.5 + 0.1 + 0.05 + 1.0 + 0.15))
    line = profile.describe_profile(seconds)
    assert "decoder backward 0.700 s (35%)" in line and "other" in line


@pytest.mark.slow
def test_every_part_runs_on_a_cpu_at_a_tiny_shape() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = [
        "--device",
        "cpu",
        "--tiny",
        "--dtype",
        "float32",
        "--batch",
        "4",
        "--median",
        "40",
        "--budget",
        "256",
        "--repeats",
        "1",
        "--long-rows",
        "2",
        "--decode-batch",
        "2",
        "--new-tokens",
        "4",
        "--compile-backend",
        "eager",
    ]
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu_mfu.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "FAILED" not in out
    ratio = float(re.search(r"frlab/plain per FLOP: ([0-9.]+)", out).group(1))
    assert math.isfinite(ratio) and ratio > 0
    assert re.search(r"profile: decoder forward .* other \(Lightning, data, host syncs\)", out)
    assert len(re.findall(r"^peak memory: .* plan [0-9.]+ [MG]iB", out, re.M)) == 3
    assert re.search(r"^decode: .* tokens/s", out, re.M)
    assert re.search(r"^compile \(eager\): first update .* [1-9][0-9]* graphs compiled", out, re.M)
