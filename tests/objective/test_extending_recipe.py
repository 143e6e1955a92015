"""The extending guide's component recipe (docs/extending.md, "A new objective component"),
carried out step by step on a scratch copy of the repository.

The copy gets the guide's trust-region example, its hand-computed test and its per-row
reference (the guide's marked blocks), and a new token filter and a new aggregation written
the same way (below); the guide's own commands then regenerate the derived files and run the
objective tests, which pass with the new components covered and nothing else edited. The
dry-run plan shows the new components' values (not their defaults), and `python -m frlab`
trains the CPU default with them. Subprocesses run the copy's code (its root first on
PYTHONPATH, run from its root), so nothing here touches this checkout or this process's
registries.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pytest
from helpers.recipe import LOOP_FILE, append, frlab, marked, recipe_commands, run, scratch_copy

FILTER = '''

@TOKEN_FILTERS.register("first_fraction")
@dataclass(frozen=True)
class FirstFraction(TokenFilter):
    """Keep the first `ceil(q*T_i)` policy tokens of every trajectory."""

    source = "extending recipe test"
    q: float = hyperparameter(1.0, low=0.0, high=1.0, doc="kept fraction of each trajectory")

    def __call__(
        self, action_mask: Tensor, entropies: Tensor | None = None, failures: Tensor | None = None
    ) -> Tensor:
        _, k_i = token_budget(action_mask, self.q)
        return action_mask & (action_mask.cumsum(dim=1) <= k_i.unsqueeze(1))
'''

FILTER_TEST = '''

def test_first_fraction_hand_values() -> None:
    """T_i = 4 in both rows: q = 0.5 keeps the first 2 policy tokens, q = 0.6 the first
    ceil(2.4) = 3 (row 1 skips its masked slot), q = 0 none; no entropies needed."""

    def first(q: float) -> list[list[bool]]:
        return TOKEN_FILTERS.build("first_fraction", q=q)(MASK, None, None).tolist()

    assert first(0.5) == [[True, True, False, False, False], [True, True, False, False, False]]
    assert first(0.6) == [[True, True, True, False, False], [True, True, False, True, False]]
    assert first(0.0) == [[False] * 5, [False] * 5]
    assert not TOKEN_FILTERS.build("first_fraction", q=0.5).needs_entropies
'''

AGGREGATION = '''

@AGGREGATIONS.register("length_power")
@dataclass(frozen=True)
class LengthPower(Aggregation):
    """Per-trajectory sum of kept terms / `T_i ** alpha`, then mean over B."""

    source = "extending recipe test"
    alpha: float = hyperparameter(1.0, low=0.0, high=1.0, doc="exponent of T_i (1: sample_mean)")

    def __call__(
        self,
        token_terms: Tensor,
        keep: Tensor,
        action_mask: Tensor,
        *,
        num_sequences: int | Tensor,
        num_tokens: int | Tensor,
    ) -> Tensor:
        b = _normaliser(num_sequences, "num_sequences")
        t_i = count_per_row(action_mask).to(token_terms.dtype)
        return (kept_row_sums(token_terms, keep) / t_i**self.alpha).sum() / b
'''

AGGREGATION_TEST = '''

def test_length_power_hand_values() -> None:
    """Kept row sums (3, 4) over T_i ** alpha, T = (3, 2), B = 2: alpha = 1 is sample_mean's
    1.5, alpha = 0.5 gives (3 / sqrt 3 + 4 / sqrt 2) / 2, alpha = 0 the mean row sum 3.5."""

    def loss(alpha: float) -> float:
        f = agg("length_power", alpha=alpha)
        return f(TERMS, KEEP, MASK, num_sequences=2, num_tokens=5).item()

    assert loss(1.0) == pytest.approx(1.5, rel=1e-15)
    assert loss(0.5) == pytest.approx((3 / 3**0.5 + 4 / 2**0.5) / 2, rel=1e-15)
    assert loss(0.0) == pytest.approx(3.5, rel=1e-15)
'''

REFERENCES = """

@reference("token_filter", "first_fraction", params={"q": 0.6})
def first_fraction(entropies: list[float], failed: bool, q: float) -> list[bool]:
    k = math.ceil(q * len(entropies))
    return [j < k for j in range(len(entropies))]


@reference("aggregation", "length_power", params={"alpha": 0.5})
def length_power(terms: list[list[float]], keep: list[list[bool]], alpha: float) -> float:
    return sum(sum(row) / len(row) ** alpha for row in terms) / len(terms)
"""

NEW = [
    "objective.trust_region=max_log_ratio",
    "objective.max_log_ratio.bound=0.3",
    "objective.token_filter=first_fraction",
    "objective.first_fraction.q=0.5",
    "objective.aggregation=length_power",
    "objective.length_power.alpha=0.5",
]


@pytest.mark.slow
def test_the_component_recipe_adds_a_token_filter_and_an_aggregation(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path)
    where = run(
        root, [sys.executable, "-c", "import envs, frlab; print(frlab.__file__, envs.__file__)"]
    )
    assert where.returncode == 0 and all(
        Path(p).is_relative_to(root) for p in where.stdout.split()
    ), where.stdout + where.stderr  # the copy's code is what runs

    # 1. the classes, at the end of their kinds' files
    append(root, "frlab/objective/trust_regions.py", marked("extending-example"))
    append(root, "frlab/objective/token_filters.py", FILTER)
    append(root, "frlab/objective/aggregations.py", AGGREGATION)
    # 2. their hand-computed tests, in the mirrored test files
    append(root, "tests/objective/test_trust_regions.py", marked("extending-test"))
    append(root, "tests/objective/test_token_filters.py", FILTER_TEST)
    append(root, "tests/objective/test_aggregations.py", AGGREGATION_TEST)

    # a component without its per-row reference fails the loop test, naming the file to edit
    early = run(
        root,
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "tests/objective/test_objective_loops.py",
            "-k",
            "has_a_loop_reference",
        ],
    )
    assert early.returncode == 1 and "3 failed" in early.stdout, early.stdout[-3000:]
    for kind, name in (
        ("trust_region", "max_log_ratio"),
        ("token_filter", "first_fraction"),
        ("aggregation", "length_power"),
    ):
        assert f"{kind} '{name}' has no per-row reference" in early.stdout, early.stdout[-3000:]
    assert f"to {LOOP_FILE}" in early.stdout

    # 3. their per-row references
    append(root, LOOP_FILE, marked("extending-reference"))
    append(root, LOOP_FILE, REFERENCES)

    # 4. the guide's commands: regenerate, then the objective tests
    catalog, tests = recipe_commands()
    assert catalog[1:] == ["-m", "frlab.generated", "--write"], catalog
    wrote = run(root, catalog)
    assert wrote.returncode == 0, wrote.stderr[-3000:]
    for path in ("configs/objective/params/default.yaml", "README.md", "docs/config-keys.md"):
        assert f"wrote {path}" in wrote.stdout, wrote.stdout
    assert run(root, [sys.executable, "-m", "frlab.generated"]).returncode == 0  # current
    assert "first_fraction" in (root / "docs/config-keys.md").read_text()
    ran = run(root, [*tests, "-v"], timeout=600)
    assert ran.returncode == 0, ran.stdout[-6000:]
    for test_id in (
        "test_objective_matches_loop[max_log_ratio-length_power-first_fraction] PASSED",
        "test_objective_matches_loop[sequence_bernoulli_kl-sample_mean-first_fraction] PASSED",
        "test_micro_batches_sum_to_the_full_batch[max_log_ratio-length_power-first_fraction] "
        "PASSED",
        "test_every_component_is_selectable_documented_and_logged[aggregation-length_power] PASSED",
        "test_first_fraction_hand_values PASSED",
        "test_length_power_hand_values PASSED",
        "test_max_log_ratio_hand_values PASSED",
        "test_the_key_reference_is_current_and_covers_the_open_nodes PASSED",
    ):
        assert test_id in ran.stdout, test_id

    # 5. selected from the command line: the plan shows the values given, and it trains
    plan = frlab(root, "dry_run=true", *NEW)
    assert plan.returncode == 0, plan.stderr[-3000:]
    text = " ".join(plan.stdout.split())
    assert (
        "objective : baseline=batch_mean trust_region=max_log_ratio(bound=0.3) "
        "aggregation=length_power(alpha=0.5) token_filter=first_fraction(q=0.5)"
    ) in text, text
    assert "trust : max_log_ratio bound=0.3; token filter first_fraction q=0.5" in text, text
    run_dir = tmp_path / "run"
    trained = frlab(root, *NEW, "trainer.max_steps=2", f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-4000:]
    with (run_dir / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("step")]
    assert [int(r["step"]) for r in rows] == [1, 2]
    for row in rows:
        assert math.isfinite(float(row["train/loss"]))
        assert 0.0 < float(row["train/retained_tokens_frac"]) < 1.0  # the filter dropped tokens
        assert float(row["train/max_log_ratio/max_abs_log_ratio_mean"]) >= 0.0
