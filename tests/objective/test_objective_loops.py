"""Loop-vs-vectorised equivalence: the `Objective` against slow per-row Python references.

Every registered component has its reference in tests/helpers/objective_loops.py (what each
kind's reference takes and returns is in its docstring); a component without one fails
`test_every_registered_component_has_a_loop_reference` with a message naming that file, so a new
component is covered here without editing this file. The comparison runs in float64 with the
hyperparameters the reference chooses (gate thresholds inside the data).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from helpers.objective import make_batch
from helpers.objective_loops import LOOP_FILE, REFERENCES, Row, missing_reference

from frlab.objective import KINDS, Objective
from frlab.objective.catalog import components


def covered(kind: str) -> list[str]:
    """The registered components of `kind` that have a reference (the others fail below)."""
    return [name for name in KINDS[kind].names() if name in REFERENCES[kind]]


def rows_of(x: dict) -> list[Row]:
    """The batch's rows: each row's policy tokens as plain floats."""
    mask = x["action_mask"]
    return [
        Row(
            log_probs=[float(v) for v in x["log_probs"][i][mask[i]]],
            behavior_log_probs=[float(v) for v in x["behavior_log_probs"][i][mask[i]]],
            entropies=[float(v) for v in x["entropies"][i][mask[i]]],
            failed=bool(x["failures"][i]),
        )
        for i in range(mask.shape[0])
    ]


def loop_objective(x: dict, names: dict[str, str], hp: dict[str, dict]) -> dict[str, Any]:
    """(loss, d loss / d log_probs, admitted, retained) from the per-row references."""
    mask = x["action_mask"]
    b, t = mask.shape
    ref = {kind: REFERENCES[kind][name].function for kind, name in names.items()}
    kw = {kind: hp.get(name, {}) for kind, name in names.items()}
    adv = ref["baseline"](x["rewards"].tolist(), x["group_ids"].tolist(), **kw["baseline"])
    rows, weights, gates = [], [], []
    for i, row in enumerate(rows_of(x)):
        keep = ref["token_filter"](row.entropies, row.failed, **kw["token_filter"])
        row = replace(row, keep=list(keep), advantage=adv[i])
        w, gate = ref["trust_region"](row, **kw["trust_region"])
        rows.append(row)
        weights.append(w)
        gates.append(gate)
    keeps = [row.keep for row in rows]
    factor = [  # d term / d log pi of each policy token (0 where not kept)
        [-wj * row.advantage if kj else 0.0 for wj, kj in zip(w, row.keep, strict=True)]
        for row, w in zip(rows, weights, strict=True)
    ]
    terms = [
        [f * c for f, c in zip(fr, row.log_probs, strict=True)]
        for fr, row in zip(factor, rows, strict=True)
    ]
    aggregate = ref["aggregation"]
    loss = aggregate(terms, keeps, **kw["aggregation"])
    grad = [[0.0] * t for _ in range(b)]
    positions = [[j for j in range(t) if mask[i, j]] for i in range(b)]
    for i, pos in enumerate(positions):
        for k, j in enumerate(pos):
            if keeps[i][k]:
                unit = [
                    [1.0 if (r, s) == (i, k) else 0.0 for s in range(len(p))]
                    for r, p in enumerate(positions)
                ]
                grad[i][j] = aggregate(unit, keeps, **kw["aggregation"]) * factor[i][k]
    admitted = [any(gate) for gate in gates]
    retained = [
        sum(k and g for k, g in zip(row.keep, gate, strict=True))
        for row, gate in zip(rows, gates, strict=True)
    ]
    return {"loss": loss, "grad": grad, "admitted": admitted, "retained": retained, "gates": gates}


def chosen_params(x: dict, names: dict[str, str]) -> dict[str, dict]:
    """The hyperparameters each chosen component's reference runs with (its defaults if none)."""
    rows = rows_of(x)
    out = {name: REFERENCES[kind][name].params_for(rows) for kind, name in names.items()}
    return {name: values for name, values in out.items() if values}


# --------------------------------------------------------------------------- coverage


@pytest.mark.parametrize(("kind", "name"), [(kind, cls.name) for kind, cls in components()])
def test_every_registered_component_has_a_loop_reference(kind: str, name: str) -> None:
    assert name in REFERENCES[kind], missing_reference(kind, name)


def test_every_loop_reference_is_of_a_registered_component() -> None:
    stale = [
        f"{kind} {name!r}"
        for kind, refs in REFERENCES.items()
        for name in refs
        if name not in KINDS[kind]
    ]
    assert not stale, f"{LOOP_FILE} has references of unregistered components: {stale}"


# --------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("filt", covered("token_filter"))
@pytest.mark.parametrize("agg", covered("aggregation"))
@pytest.mark.parametrize("tr", covered("trust_region"))
def test_objective_matches_loop(tr: str, agg: str, filt: str) -> None:
    """Loss, gradient, admitted and retained_tokens equal the per-row loop (float64)."""
    seed = sum(map(ord, tr + agg + filt)) % 1000
    x = make_batch(8, 11, seed=seed, drift=0.3)
    names = {"baseline": "batch_mean", "trust_region": tr, "aggregation": agg, "token_filter": filt}
    obj = Objective(**names, params=chosen_params(x, names))
    ref = loop_objective(x, names, obj.component_params())
    lp = x["log_probs"].clone().requires_grad_(True)
    adv = obj.advantages(x["rewards"], x["group_ids"])
    loss, diag = obj(
        lp,
        x["behavior_log_probs"],
        adv,
        x["action_mask"],
        entropies=x["entropies"],
        failures=x["failures"],
    )
    loss.backward()
    assert loss.item() == pytest.approx(ref["loss"], rel=1e-10, abs=1e-13)
    torch.testing.assert_close(
        lp.grad, torch.tensor(ref["grad"], dtype=torch.float64), rtol=1e-10, atol=1e-13
    )
    assert diag["admitted"].tolist() == ref["admitted"]
    assert diag["retained_tokens"].tolist() == ref["retained"]
    if not KINDS["trust_region"].get(tr).admits_all:  # the gate is exercised: some in, some out
        assert any(ref["admitted"]) and not all(all(g) for g in ref["gates"]), (
            f"the parameters of {tr!r}'s reference put its gate outside the test batch"
        )


@pytest.mark.parametrize("baseline", covered("baseline"))
def test_advantages_match_loop(baseline: str) -> None:
    x = make_batch(8, 5, seed=11)
    names = {"baseline": baseline}
    objective = Objective(baseline=baseline, params=chosen_params(x, names))
    got = objective.advantages(x["rewards"], x["group_ids"])
    hp = objective.component_params().get(baseline, {})
    ref = REFERENCES["baseline"][baseline].function(
        x["rewards"].tolist(), x["group_ids"].tolist(), **hp
    )
    assert got.tolist() == pytest.approx(ref, rel=1e-12, abs=1e-14)
