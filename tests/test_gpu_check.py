"""scripts/gpu_check.py: throughput arithmetic, the model shape, argument errors, failure
detection, and a real 2-update run of the same async path on CPU with a tiny model."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gc = _load()


def _record(wall: float, learner: float, sampled: int, trained: int):
    return gc.StepRecord(wall, learner, sampled, trained, reward_mean=0.5, lag_max=1)


def test_summarize_skips_the_warmup_update_and_divides_by_the_right_times() -> None:
    records = [_record(100.0, 50.0, 7, 9), _record(2.0, 0.5, 64, 100), _record(6.0, 1.5, 96, 300)]
    s = gc.summarize(records)
    assert s["rollout_tokens_per_s"] == pytest.approx((64 + 96) / 8.0)
    assert s["learner_tokens_per_s"] == pytest.approx(400 / 2.0)
    assert s["step_time_s"] == pytest.approx(4.0)
    assert s["learner_step_s"] == pytest.approx(1.0)
    assert s["learner_idle_frac"] == pytest.approx(0.75)
    assert s["timed_steps"] == 2


def test_summarize_with_only_the_warmup_update_uses_it_and_empty_raises() -> None:
    s = gc.summarize([_record(4.0, 2.0, 40, 80)])
    assert s["rollout_tokens_per_s"] == pytest.approx(10.0)
    assert s["learner_tokens_per_s"] == pytest.approx(40.0)
    with pytest.raises(ValueError, match="at least one"):
        gc.summarize([])


def test_model_config_has_qwen25_0p5b_shape_and_parameter_count() -> None:
    from transformers import AutoModelForCausalLM

    cfg = gc.model_config(tiny=False)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (896, 24, 151936)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied embeddings
    assert sum(p.numel() for p in model.parameters()) == 494_032_768  # Qwen2.5-0.5B


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--steps", "0"], "--steps"),
        (["--batch-size", "-2"], "--batch-size"),
        (["--device", "tpu"], "--device"),
        (["--device", "cpu", "--max-policy-lag", "0"], "--max-policy-lag"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(argv, flag, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        gc.parse_args(argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_check_reports_unsynced_engine_failed_rollouts_and_missing_updates() -> None:
    records = [_record(1.0, 0.5, 8, 16)]
    meter = SimpleNamespace(pool_stats={"failed": 1, "rejected": 0})
    problems = gc.check(records, meter, [SimpleNamespace(version=1)], steps=2)
    assert len(problems) == 3
    assert any("weight sync not applied" in p for p in problems)
    assert any("failed or were rejected" in p for p in problems)
    ok = gc.check(records * 2, SimpleNamespace(pool_stats={}), [SimpleNamespace(version=2)], 2)
    assert ok == []


@pytest.mark.slow
def test_cpu_run_prints_the_three_throughput_numbers_and_exits_0(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = ["--tiny", "--device", "cpu", "--steps", "2", "--batch-size", "2", "--new-tokens", "4"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    for key in gc.THROUGHPUT_KEYS:
        value = float(lines[key])
        assert math.isfinite(value) and value > 0, (key, value)
    assert lines["engine_version"] == "2" and lines["timed_steps"] == "1"
    assert proc.stdout.rstrip().endswith("gpu_check: OK")


def _vllm_check():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(
        "gpu_check_vllm", REPO / "scripts/gpu_check_vllm.py"
    )
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_vllm_check_diffs_and_server_command() -> None:
    check = _vllm_check()
    assert check.abs_diffs([-1.0, -2.0, -0.5], [-1.25, -2.0, -0.25]) == (0.25, pytest.approx(1 / 6))
    with pytest.raises(ValueError, match="length"):
        check.abs_diffs([-1.0], [])
    words = check.serve_command(Path("/m"), 8199)
    assert words[words.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert words[words.index("--generation-config") + 1] == "vllm"
    assert "VLLM_SERVER_DEV_MODE=1" in words and words[words.index("--port") + 1] == "8199"


def test_vllm_check_reports_skipped_without_vllm_or_cuda() -> None:
    if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
        pytest.skip("vllm and a GPU are here: scripts/gpu_check.sh runs the real check")
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts/gpu_check_vllm.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "gpu_check_vllm: SKIPPED" in proc.stdout, proc.stderr


def test_gpu_check_parts_fit_eight_minutes_and_keep_their_output() -> None:
    """Every part of scripts/gpu_check.sh runs under its own timeout, logged to its own file;
    without vLLM (the GPU machine has none) the timeouts add up to at most 8 minutes."""
    import re

    text = (REPO / "scripts" / "gpu_check.sh").read_text()
    parts = re.findall(r'^\s*part (\w+) "\$\{T_\w+:-(\d+)\}"', text, re.M)
    names = [name for name, _ in parts]
    assert {"async", "gpu_tests", "packing", "mfu", "vllm", "vllm_tests"} <= set(names)
    without_vllm = sum(int(s) for name, s in parts if not name.startswith("vllm"))
    assert without_vllm <= 8 * 60, parts
    assert 'tee "$LOGS/$name.log"' in text and 'timeout "$seconds"' in text
