"""`RolloutPool` keyword arguments as a Python caller gives them: from the declarations' defaults.

`pool_settings(**changes)`: `rollout.mode`, `rollout.samples_per_prompt`,
`rollout.max_prompt_retries` and the root `seed` at
their declared defaults (frlab.config.schema), off-policy correction on (the FlashREINFORCE
objective's), then `changes` (the pool's sizes, which every test chooses, among them).
"""

from __future__ import annotations

from typing import Any

from frlab.config.schema import FrlabConfig, RolloutConfig


def pool_settings(**changes: Any) -> dict[str, Any]:
    declared = {
        "mode": RolloutConfig.mode,
        "samples_per_prompt": RolloutConfig.samples_per_prompt,
        "max_prompt_retries": RolloutConfig.max_prompt_retries,
        "seed": FrlabConfig.seed,
        "off_policy_correction": True,
    }
    return {**declared, **changes}
