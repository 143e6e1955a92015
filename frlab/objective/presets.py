"""The objective's presets: paper and baseline algorithms as one component name per slot.

`DEFAULTS` is what `Objective()` composes (the FlashREINFORCE paper's components); each preset
changes some slots, and `PRESET_NOTES` says in one line what it is (the header of its generated
`configs/objective/<name>.yaml`, `python -m frlab.generated --write`). The names are the
registered components' (frlab.objective.baselines, trust_regions, aggregations,
token_filters).
"""

from __future__ import annotations

DEFAULTS: dict[str, str] = {
    "baseline": "batch_mean",
    "trust_region": "sequence_bernoulli_kl",
    "aggregation": "sample_mean",
    "token_filter": "none",
}


def _preset(baseline: str, trust_region: str, aggregation: str) -> dict[str, str]:
    return dict(DEFAULTS, baseline=baseline, trust_region=trust_region, aggregation=aggregation)


PRESETS: dict[str, dict[str, str]] = {
    "flashreinforce": _preset("batch_mean", "sequence_bernoulli_kl", "sample_mean"),
    "pg_is": _preset("batch_mean", "none", "sample_mean"),
    "grpo": _preset("group_mean_std", "ppo_clip", "sample_mean"),
    "dr_grpo": _preset("group_mean", "ppo_clip", "constant_length"),
    "rloo": _preset("rloo", "none", "sample_mean"),
}
# What each preset is, one line (the header of its generated configs/objective/<name>.yaml).
PRESET_NOTES: dict[str, str] = {
    "flashreinforce": "FlashREINFORCE (the paper): batch-mean baseline, sequence Bernoulli-KL "
    "gate, sample mean.",
    "pg_is": "Plain token importance sampling, no trust region (ablation).",
    "grpo": "GRPO: group-normalised advantages, PPO clip. Needs rollout.samples_per_prompt > 1.",
    "dr_grpo": "Dr. GRPO: group mean without std, constant-length normaliser. Needs "
    "rollout.samples_per_prompt > 1.",
    "rloo": "RLOO: leave-one-out group baseline. Needs rollout.samples_per_prompt > 1.",
}
