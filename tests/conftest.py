"""Shared pytest setup: puts tests/ on sys.path so that every test folder imports the shared
helpers of tests/helpers as `helpers.NAME`, runs the test commands on two workers, and decides
the fate of the two vLLM tiers where their environment is missing: a skip naming the script
that builds it, or a failure when the tier is required (CI sets the variable); and restores
torch's thread count after each test.

Two commands (pyproject.toml's `addopts` holds `-m "not slow"`): `python -m pytest -q` is the
fast loop, every test not marked `slow`; `python -m pytest -q -m slow` runs the rest; `-m ""`
runs both at once.

Two workers: those commands run on WORKERS pytest-xdist processes, each test module on one
worker (`--dist loadscope`: a module's fixtures are built once), when pytest-xdist is installed
(the `test` extra has it) and no `-n` is given; `-n 0` runs serially. A tier command
(`-m vllm_cpu`, `-m vllm_contract`) stays serial: its real engines and servers need the cores.
Modules start longest first (LONGEST_FIRST, then by their number of tests, as xdist orders
them by default): a module that takes a third of the run must not start last and leave one
worker idle while it ends.

- `vllm_contract`: frlab's adapters against vLLM's Python code (scripts/vllm_contract_env.sh,
  FRLAB_REQUIRE_VLLM_CONTRACT=1);
- `vllm_cpu`: real vLLM engines and servers on this CPU, with vLLM's CPU build
  (scripts/vllm_cpu_env.sh, FRLAB_REQUIRE_VLLM_CPU=1)."""

from __future__ import annotations

import collections
import functools
import importlib.util
import os
import sys
from collections.abc import Iterator

import pytest

WORKERS = 2
# The modules that took longest in the slow command (minutes on the 2-core machine, measured
# with --durations): started first, longest first. The order changes wall time, never results.
LONGEST_FIRST = (
    "tests/test_smollm2_arith_cpu.py",  # 14-21: a real pretrained model learns
    "tests/rollout/remote/test_fleet_secret.py",  # 1.5-7
    "tests/test_main.py",  # 4-6
    "tests/learner/test_learner_fsdp.py",  # 3-4
    "tests/rollout/remote/test_fleet_outages.py",  # 2-4
    "tests/reliability/test_sync_reproducibility.py",  # 3-3.5
    "tests/config/test_presets.py",  # 2-3.5
    "tests/reliability/test_crash_resume.py",  # 3
    "tests/rollout/test_extending_engine.py",  # 3
)
CONTRACT_ENV = "bash scripts/vllm_contract_env.sh"
CPU_ENV = "bash scripts/vllm_cpu_env.sh"


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The test commands on WORKERS workers (see the module docstring); not a tier command, not
    inside a worker, and not in a pytest run that a test starts from a worker (it inherits the
    variable)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.pluginmanager.hasplugin("xdist"):
        return
    tier = any(marker in (config.option.markexpr or "") for marker in TIERS)
    if config.option.numprocesses is None and not tier:
        config.option.numprocesses = WORKERS
        config.option.dist = "loadscope"
        config.option.loadscopereorder = False  # pytest_collection_modifyitems orders them


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules in the order they start on the workers: LONGEST_FIRST, then the rest by their
    number of tests (most first); each module's tests keep their order. Deterministic, so every
    worker collects the same order (xdist checks)."""
    sizes = collections.Counter(item.nodeid.split("::")[0] for item in items)
    first = {module: rank for rank, module in enumerate(LONGEST_FIRST)}
    starts = sorted(sizes, key=lambda m: (first.get(m, len(first)), -sizes[m]))
    rank = {module: i for i, module in enumerate(starts)}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])


def vllm_contract_missing() -> str | None:
    """Why the `vllm_contract` tier cannot run here (None: it can)."""
    if importlib.util.find_spec("vllm") is None:
        return (
            "vLLM is not installed: the vllm_contract tier runs in the environment that "
            f"`{CONTRACT_ENV}` builds (see the README's test section)"
        )
    return None


@functools.cache
def vllm_cpu_missing() -> str | None:
    """Why the `vllm_cpu` tier cannot run here (None: it can): vLLM must be installed and its
    platform, asked of vLLM itself, must be the CPU."""
    if importlib.util.find_spec("vllm") is None:
        return (
            "vLLM is not installed: the vllm_cpu tier runs in the environment that "
            f"`{CPU_ENV}` builds (see the README's test section)"
        )
    from frlab.rollout.vllm.platform import installed_platform

    platform = installed_platform()
    if platform != "cpu":
        return (
            f"the installed vLLM serves on {platform!r}, not the CPU: `{CPU_ENV}` builds its CPU "
            "build"
        )
    return None


TIERS = {
    "vllm_contract": (vllm_contract_missing, "FRLAB_REQUIRE_VLLM_CONTRACT"),
    "vllm_cpu": (vllm_cpu_missing, "FRLAB_REQUIRE_VLLM_CPU"),
}


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, (missing, required) in TIERS.items():
        if item.get_closest_marker(marker) is None:
            continue
        reason = missing()
        if reason is None:
            continue
        if os.environ.get(required) == "1":
            pytest.fail(f"{required}=1 but {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def _torch_threads_kept() -> Iterator[None]:
    """A test that changes torch's process-wide thread count (a `main` called in-process sets
    it) gets it restored: a later test on the same worker that compares runs at this
    process's count must not depend on which tests the worker ran before."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    if before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)
