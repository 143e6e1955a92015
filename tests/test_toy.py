"""`python -m frlab.toy`: one real update on a tiny model, finite values, parameters move."""

import re
import subprocess
import sys

import pytest

from frlab.toy import main


@pytest.mark.slow
def test_toy_cli_runs_one_finite_update() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "frlab.toy"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    values = dict(re.findall(r"^\s*(\w+): (\S+)$", out.stdout, flags=re.M))
    for key in ("loss", "acceptance_rate", "param_delta_l2", "grad_norm"):
        assert key in values, out.stdout
    # Same weights sample and learn: the behaviour/current KL is ~0, so every trajectory is
    # admitted.
    assert float(values["acceptance_rate"]) == 1.0
    assert float(values["param_delta_l2"]) > 0.0


def test_toy_rejects_a_nan_delta() -> None:
    import pytest

    with pytest.raises(ValueError, match="delta"):
        main(["--delta", "nan"])
