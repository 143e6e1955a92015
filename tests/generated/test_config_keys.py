"""The reference of every config key (docs/config-keys.md), rendered from the declarations."""

from __future__ import annotations

from frlab.generated import KEYS_FILE, ROOT
from frlab.generated.config_keys import generate


def test_the_key_reference_is_current_and_covers_the_open_nodes() -> None:
    text = generate()
    assert (ROOT / KEYS_FILE).read_text() == text, "run: python -m frlab.generated --write"
    for key in (
        "`rollout.sampling.temperature`",
        "`env.options`",
        "`env.seed`",
        "`env.limit`",
        "`eval.benchmarks.NAME.options`",
        "`trainer.max_time`",
        "`rollout/engine`",
        "`optim.betas` | [float, float]",
        "`data.pack_sequences` | bool | `true`",
    ):
        assert key in text, key
