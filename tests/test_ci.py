"""`.ci/run` must run exactly the README's install and test commands."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


CONTRACT_BUILD = "bash scripts/vllm_contract_env.sh"
CONTRACT_TEST = (
    "FRLAB_REQUIRE_VLLM_CONTRACT=1 .venv-vllm-contract/bin/python -m pytest -q -m vllm_contract "
    "tests/vllm_contract"
)


def _readme_commands() -> tuple[str, str]:
    text = (ROOT / "README.md").read_text()
    install = re.search(r"^(pip install -e '\.\[test\]')\s*$", text, flags=re.M)
    test = re.search(r"^(python -m pytest -q)\s*$", text, flags=re.M)
    assert install and test, "README must show the install and the test command on their own lines"
    return install.group(1), test.group(1)


def test_ci_runs_the_readmes_vllm_contract_commands_with_the_tier_required() -> None:
    """The contract tier runs in CI, where a missing vLLM is a failure (not a skip)."""
    text = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for command in (CONTRACT_BUILD, CONTRACT_TEST):
        assert re.search(rf"^{re.escape(command)}\s*$", text, flags=re.M), command
        assert re.search(rf"^{re.escape(command)}( |$)", ci, flags=re.M), command
    assert ci.index(CONTRACT_BUILD) < ci.index(CONTRACT_TEST)


def test_ci_runs_the_readme_commands() -> None:
    install, test = _readme_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^{re.escape(install)}\s*$", ci, flags=re.M)
    assert re.search(rf"^{re.escape(test)} ", ci, flags=re.M)
    for var in (
        "HF_HUB_OFFLINE=1",
        "TRANSFORMERS_OFFLINE=1",
        "HF_DATASETS_OFFLINE=1",
        "WANDB_MODE=offline",
    ):
        assert var in ci
