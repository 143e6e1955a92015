"""The dry-run plan names the chosen trust region with its own parameters."""

from __future__ import annotations

import pytest

from frlab.config.compose import compose
from frlab.config.preflight import preflight


def trust_row(overrides: list[str]) -> str:
    """The `trust` line of the printed plan, after the colon."""
    plan = preflight(compose(overrides))
    rows = [line for line in plan.format().splitlines() if line.strip().startswith("trust ")]
    assert len(rows) == 1, plan.format()
    return rows[0].split(":", 1)[1].strip()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["objective.trust_region=token_tis"], "token_tis cap=2.0;"),
        (["objective.trust_region=token_tis", "objective.token_tis.cap=5"], "token_tis cap=5.0;"),
        (["objective.trust_region=ppo_clip", "objective.ppo_clip.eps_high=0.28"],
         "ppo_clip eps_low=0.2 eps_high=0.28;"),
        (["objective.trust_region=geometric_ratio", "objective.geometric_ratio.lower=0.99"],
         "geometric_ratio lower=0.99 upper=1.001;"),
        (["objective.sequence_bernoulli_kl.delta=0.01"], "sequence_bernoulli_kl delta=0.01;"),
        (["objective.trust_region=none"], "plain token IS, no gate;"),
        (["objective.trust_region=no_is"], "no IS, no gate;"),
    ],
)  # fmt: skip
def test_trust_row_shows_the_chosen_trust_regions_parameters(
    overrides: list[str], expected: str
) -> None:
    row = trust_row(overrides)
    assert row.startswith(expected), row
    assert "off" not in row


def test_plan_records_the_trust_description() -> None:
    plan = preflight(compose(["objective.trust_region=token_tis"]))
    assert plan.to_dict()["trust"] == "token_tis cap=2.0"
    assert plan.delta is None


def plan_row(overrides: list[str], label: str) -> str:
    """The value of one labelled line of the printed plan."""
    text = preflight(compose(overrides)).format()
    rows = [line for line in text.splitlines() if line.strip().split(" :")[0].strip() == label]
    assert len(rows) == 1, text
    return rows[0].split(":", 1)[1].strip()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], "none"),
        (["eval=math"], "math avg@4 every 50 steps on GSM8K, AIME25 (T=0.7, top_p=0.7)"),
        (["eval=math", "eval.k=2", "eval.every_n_steps=7", "eval.limit=3",
          "eval.sampling.temperature=1.5"],
         "math avg@2 every 7 steps on GSM8K, AIME25 (T=1.5, top_p=0.7, first 3 each)"),
        (["experiment=r1_distill_1p5b"],
         "math avg@32 at step 0 and every 50 steps on AIME24, AIME25 (T=0.6, top_p=0.95)"),
        (["experiment=qwen_math_1p5b"],
         "math avg@4 at step 0 and every 50 steps on AMC23, Minerva, AIME25 (T=0.7, top_p=0.7)"),
        (["experiment=python_tool_qwen7b", "eval=tool_episodes"],
         "episodes avg@4 at step 0 and every 50 steps on AMC23, Minerva, AIME25 (T=0.7, top_p=0.7)"),
        (["experiment=alfworld_qwen7b"], "episodes avg@3 at step 0 and every 50 steps on seen, unseen (T=1, top_p=1)"),
        (["experiment=r1_distill_1p5b", "eval=none"], "none"),
    ],
)  # fmt: skip
def test_eval_row_names_kind_k_interval_benchmarks_and_sampling(
    overrides: list[str], expected: str
) -> None:
    assert plan_row(overrides, "eval") == expected


REMOTE = ["rollout=remote", "rollout.engine=remote"]


@pytest.mark.parametrize(
    ("overrides", "engine"),
    [
        ([], "torch"),
        ([*REMOTE, "rollout.remote.servers=[http://a:1]"], "remote (1 server)"),
        ([*REMOTE, "rollout.remote.servers=[http://a:1,http://b:2,http://c:3]"],
         "remote (3 servers)"),
        (["experiment=qwen_math_1p5b"], "vllm"),
    ],
)  # fmt: skip
def test_rollout_row_counts_the_servers_of_a_remote_fleet(
    overrides: list[str], engine: str
) -> None:
    assert plan_row(overrides, "rollout").startswith(f"async on {engine}, in flight ")


def test_plan_records_servers_and_evaluation() -> None:
    servers = "rollout.remote.servers=[http://a:1,http://b:2]"
    record = preflight(compose([*REMOTE, servers, "eval=math"])).to_dict()
    assert record["servers"] == 2 and record["engine"] == "remote"
    assert record["evaluation"] == "math avg@4 every 50 steps on GSM8K, AIME25 (T=0.7, top_p=0.7)"
    assert preflight(compose([])).to_dict()["servers"] is None
