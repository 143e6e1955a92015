"""The learner as the tests build it: `learner_module(model, objective, optim, **settings)`.

frlab.build.build_learner with a policy random-initialised from the `model` mapping when none
is given; every setting not given takes its declared default (frlab.config.schema).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from frlab.build import build_learner
from helpers.models import policy_of

POLICY_KEYS = ("name_or_path", "config", "dtype", "attn_implementation", "gradient_checkpointing")


def learner_module(
    model: Mapping[str, Any] | None = None,
    objective: Any = None,
    optim: Mapping[str, Any] | None = None,
    *,
    policy: torch.nn.Module | None = None,
    **settings: Any,
) -> Any:
    model = dict(model or {})
    if policy is None:
        policy = policy_of(**{k: model[k] for k in POLICY_KEYS if k in model})
    return build_learner(
        policy, objective or {}, optim, model=model, record={"model": model}, **settings
    )
