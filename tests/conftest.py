"""Shared pytest setup: puts tests/ on sys.path so test folders can share `*_testlib` helpers,
and decides the fate of `vllm_contract` tests where vLLM is not installed: a skip naming the
script that builds their environment, or a failure when FRLAB_REQUIRE_VLLM_CONTRACT=1 (CI)."""

from __future__ import annotations

import importlib.util
import os

import pytest

CONTRACT_ENV = "bash scripts/vllm_contract_env.sh"


def vllm_contract_missing() -> str | None:
    """Why the `vllm_contract` tier cannot run here (None: it can)."""
    if importlib.util.find_spec("vllm") is None:
        return (
            "vLLM is not installed: the vllm_contract tier runs in the environment that "
            f"`{CONTRACT_ENV}` builds (see the README's test section)"
        )
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("vllm_contract") is None:
        return
    reason = vllm_contract_missing()
    if reason is None:
        return
    if os.environ.get("FRLAB_REQUIRE_VLLM_CONTRACT") == "1":
        pytest.fail(f"FRLAB_REQUIRE_VLLM_CONTRACT=1 but {reason}", pytrace=False)
    pytest.skip(reason)
