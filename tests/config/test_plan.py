"""The dry-run plan names the chosen trust region with its own parameters."""

from __future__ import annotations

import pytest

from frlab.config.compose import compose
from frlab.config.plan import format_plan
from frlab.config.preflight import preflight


def trust_row(overrides: list[str]) -> str:
    """The `trust` line of the printed plan, after the colon."""
    plan = preflight(compose(overrides))
    rows = [line for line in format_plan(plan).splitlines() if line.strip().startswith("trust ")]
    assert len(rows) == 1, format_plan(plan)
    return rows[0].split(":", 1)[1].strip()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["objective.trust_region=token_tis"], "token_tis cap=2.0;"),
        (["objective.trust_region=token_tis", "objective.token_tis.cap=5"], "token_tis cap=5.0;"),
        (
            ["objective.trust_region=ppo_clip", "objective.ppo_clip.eps_high=0.28"],
            "ppo_clip eps_low=0.2 eps_high=0.28;",
        ),
        (
            ["objective.trust_region=geometric_ratio", "objective.geometric_ratio.lower=0.99"],
            "geometric_ratio lower=0.99 upper=1.001;",
        ),
        (["objective.sequence_bernoulli_kl.delta=0.01"], "sequence_bernoulli_kl delta=0.01;"),
        (["objective.trust_region=none"], "none: Plain token IS ratio, no gate;"),
        (
            ["objective.trust_region=no_is"],
            "no_is: Ratio against the detached current policy (weight 1), no gate;",
        ),
    ],
)
def test_trust_row_shows_the_chosen_trust_regions_parameters(
    overrides: list[str], expected: str
) -> None:
    row = trust_row(overrides)
    assert row.startswith(expected), row
    assert "off" not in row


def test_plan_records_the_trust_description() -> None:
    plan = preflight(compose(["objective.trust_region=token_tis"]))
    assert plan["trust"] == "token_tis cap=2.0"
    assert not any(k.endswith(".delta") for k in plan)


def plan_row(overrides: list[str], label: str) -> str:
    """The value of one labelled line of the printed plan."""
    text = format_plan(preflight(compose(overrides)))
    rows = [line for line in text.splitlines() if line.strip().split(" :")[0].strip() == label]
    assert len(rows) == 1, text
    return rows[0].split(":", 1)[1].strip()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], "none"),
        (["eval=math"], "math avg@4 every 50 steps on GSM8K, AIME25 (T=0.7, top_p=0.7)"),
        (
            [
                "eval=math",
                "eval.k=2",
                "eval.every_n_steps=7",
                "eval.limit=3",
                "eval.sampling.temperature=1.5",
            ],
            "math avg@2 every 7 steps on GSM8K, AIME25 (T=1.5, top_p=0.7, first 3 each)",
        ),
        (
            ["experiment=r1_distill_1p5b"],
            "math avg@32 every 128 steps and at step 0 on AIME24, AIME25 (T=0.6, top_p=0.95)",
        ),
        (
            ["experiment=qwen_math_1p5b"],
            "math avg@4 every 100 steps and at step 0 on AMC23, Minerva, AIME25 (T=0.7, top_p=0.7)",
        ),
        (
            ["experiment=python_tool_qwen7b"],
            "episodes avg@4 every 100 steps and at step 0 on AMC23, Minerva, AIME25 (T=0.7, "
            "top_p=0.7)",
        ),
        (
            ["experiment=alfworld_qwen7b"],
            "episodes avg@3 every 40 steps and at step 0 on seen, unseen (T=1, top_p=0.7)",
        ),
        (["experiment=r1_distill_1p5b", "eval=none"], "none"),
    ],
)
def test_eval_row_names_kind_k_interval_benchmarks_and_sampling(
    overrides: list[str], expected: str
) -> None:
    assert plan_row(overrides, "eval") == expected


REMOTE = [
    "rollout=remote",
    "rollout/engine=remote",
    "rollout.remote.allow_unauthenticated=true",
]  # made-up hosts: none is reached


@pytest.mark.parametrize(
    ("overrides", "engine"),
    [
        ([], "torch"),
        ([*REMOTE, "rollout.remote.servers=[http://a:1]"], "remote (1 server)"),
        (
            [*REMOTE, "rollout.remote.servers=[http://a:1,http://b:2,http://c:3]"],
            "remote (3 servers)",
        ),
        (["experiment=qwen_math_1p5b"], "vllm"),
    ],
)
def test_rollout_row_counts_the_servers_of_a_remote_fleet(
    overrides: list[str], engine: str
) -> None:
    assert plan_row(overrides, "rollout").startswith(f"async on {engine}, in flight ")


def test_plan_records_servers_and_evaluation() -> None:
    servers = "rollout.remote.servers=[http://a:1,http://b:2]"
    record = preflight(compose([*REMOTE, servers, "eval=math"]))
    assert record["servers"] == 2 and record["rollout.engine"] == "remote"
    assert record["evaluation"] == "math avg@4 every 50 steps on GSM8K, AIME25 (T=0.7, top_p=0.7)"
    assert preflight(compose([]))["servers"] is None


@pytest.mark.parametrize(
    ("overrides", "row"),
    [
        ([], "<= 64 rows; packed (one padding-free row each)"),
        (
            ["data.max_tokens_per_micro_batch=4096", "data.pack_sequences=false"],
            "<= 64 rows, <= 4096 tokens; padded rows",
        ),
    ],
)
def test_micro_batch_row_shows_the_caps_and_the_layout(overrides: list[str], row: str) -> None:
    assert plan_row(overrides, "micro") == row


def test_updates_row_says_what_zero_gradient_batches_do() -> None:
    assert plan_row([], "updates").endswith("zero-gradient batches skipped")  # toy_cpu opts in
    reference = plan_row(["optim.skip_zero_signal_steps=false"], "updates")
    assert reference.endswith("zero-gradient batches step AdamW")


def test_bad_micro_batching_values_name_the_key() -> None:
    from frlab.config.errors import ConfigError

    for override, key in (
        ("data.max_tokens_per_micro_batch=0", "data.max_tokens_per_micro_batch"),
        ("data.pack_sequences=sometimes", "data.pack_sequences"),
        ("optim.skip_zero_signal_steps=maybe", "optim.skip_zero_signal_steps"),
    ):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            preflight(compose([override]))


def test_the_plan_lists_the_values_that_differ_from_the_declared_defaults() -> None:
    plan = preflight(compose(["rollout.max_in_flight=7", "optim.lr=0.5"]))
    assert plan["changed"]["rollout.max_in_flight"] == 7 and plan["changed"]["optim.lr"] == 0.5
    assert "rollout.sampling.temperature" not in plan["changed"]  # the declared default
    assert plan["changed"]["trainer.max_steps"] == 300  # set by the toy_cpu preset
    assert "rollout.engine.device" not in plan["changed"]  # follows rollout.device
    text = format_plan(plan)
    assert "rollout.max_in_flight=7" in text and "optim.lr=0.5" in text
    assert "model.name_or_path=null" in text


@pytest.mark.slow
def test_the_changed_row_shows_the_engine_and_env_keys_set() -> None:
    """The engine node against its declaration, the env node against its class's constructor
    defaults: `rollout.engine.num_threads=2`, `env.num_digits=5`, key by key."""
    plan = preflight(
        compose(
            [
                "rollout/engine=torch_process",
                "rollout.engine.num_threads=2",
                "rollout.engine.packed_prefill=false",
                "env.num_digits=5",
            ]
        )
    )
    assert plan["changed"]["rollout.engine.num_threads"] == 2
    assert plan["changed"]["rollout.engine.packed_prefill"] is False
    assert plan["changed"]["env.num_digits"] == 5
    assert "rollout.engine" not in plan["changed"]  # not the whole node
    assert "rollout.engine.start_timeout_s" not in plan["changed"]  # the declared default
    text = " ".join(format_plan(plan).split())
    assert "rollout.engine.num_threads=2" in text and "env.num_digits=5" in text
    default = preflight(compose([]))
    assert not [k for k in default["changed"] if k.startswith("rollout.engine")]
    from frlab.config.plan import _env_values

    tool_env = _env_values(compose(["env=python_tool"]))  # max_turns follows rollout.max_turns
    assert "max_turns" not in tool_env and "_target_" in tool_env


def test_objective_row_shows_every_components_own_values() -> None:
    overrides = [
        "objective=dr_grpo",
        "rollout=sync",
        "rollout.samples_per_prompt=2",
        "objective.constant_length.length=512",
        "objective.ppo_clip.eps_high=0.28",
        "objective.token_filter=entropy_failures",
        "objective.entropy_failures.q=0.5",
    ]
    assert plan_row(overrides, "objective") == (
        "baseline=group_mean trust_region=ppo_clip(eps_low=0.2, eps_high=0.28) "
        "aggregation=constant_length(length=512) token_filter=entropy_failures(q=0.5)"
    )
    assert plan_row(["objective.baseline=batch_mean_std"], "objective").startswith(
        "baseline=batch_mean_std(eps=1e-06) trust_region=sequence_bernoulli_kl(delta=0.003) "
    )
