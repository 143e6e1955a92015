"""Loop-vs-vectorised equivalence: the `Objective` against a slow per-row Python reference.

The reference below is written for obviousness, not speed: plain Python floats, one row and
one token at a time, every formula spelled out as in the FlashREINFORCE paper and the component
docstrings (p, q clamped to [1e-6, 1 - 1e-6] and `log(1 - p)` written literally). Gate thresholds are
placed halfway between two observed statistics, so rounding cannot flip a decision.
"""

from __future__ import annotations

import math

import pytest
import torch
from objective_testlib import make_batch

from frlab.objective import AGGREGATIONS, BASELINES, TRUST_REGIONS, Objective

EPS = 1e-6


# --------------------------------------------------------------------------- reference


def loop_advantages(r: list[float], g: list[int], name: str, eps: float = 1e-6) -> list[float]:
    b = len(r)
    if name == "none":
        return list(r)
    if name in ("batch_mean", "batch_mean_std"):
        m = sum(r) / b
        if name == "batch_mean":
            return [x - m for x in r]
        std = math.sqrt(sum((x - m) ** 2 for x in r) / b)
        return [(x - m) / (std + eps) for x in r]
    out = []
    for i, x in enumerate(r):
        members = [r[j] for j in range(b) if g[j] == g[i]]
        n, m = len(members), sum(members) / len(members)
        if name == "group_mean":
            out.append(x - m)
        elif name == "group_mean_std":
            std = math.sqrt(sum((y - m) ** 2 for y in members) / (n - 1))
            out.append((x - m) / (std + eps))
        else:  # rloo
            out.append(x - (sum(members) - x) / (n - 1))
    return out


def clamp_p(x: float) -> float:
    return min(max(x, EPS), 1.0 - EPS)


def bernoulli_d(cur: float, beh: float) -> float:
    p, q = clamp_p(math.exp(beh)), clamp_p(math.exp(cur))
    return p * (math.log(p) - math.log(q)) + (1 - p) * (math.log(1 - p) - math.log(1 - q))


def row_stats(cur: list[float], beh: list[float]) -> dict[str, object]:
    """Per-token rho, d and the per-row statistics every trust region looks at."""
    n = len(cur)
    rho = [math.exp(c - b) for c, b in zip(cur, beh, strict=True)]
    d = [bernoulli_d(c, b) for c, b in zip(cur, beh, strict=True)]
    return {
        "rho": rho,
        "d": d,
        "kl": max(0.0, sum(d) / n),
        "k3": sum(r - 1 - math.log(r) for r in rho) / n,
        "geo": math.exp(sum(math.log(r) for r in rho) / n),
    }


def loop_weights(st: dict, a: float, name: str, kw: dict) -> tuple[list[float], bool]:
    """Weights of one row's policy tokens and whether the row is admitted."""
    rho, d = st["rho"], st["d"]
    if name == "no_is":
        return [1.0] * len(rho), True
    if name == "none":
        return list(rho), True
    if name == "token_tis":
        return [min(r, kw["cap"]) for r in rho], True
    if name == "ppo_clip":
        hi, lo = 1 + kw["eps_high"], 1 - kw["eps_low"]
        return [0.0 if (a > 0 and r > hi) or (a < 0 and r < lo) else r for r in rho], True
    if name == "token_bernoulli_kl":
        w = [r if dt <= kw["delta"] else 0.0 for r, dt in zip(rho, d, strict=True)]
        return w, any(dt <= kw["delta"] for dt in d)
    if name == "sequence_bernoulli_kl":
        ok = st["kl"] <= kw["delta"]
    elif name == "sequence_k3":
        ok = st["k3"] <= kw["delta"]
    else:  # geometric_ratio
        ok = kw["lower"] <= st["geo"] <= kw["upper"]
    return [r if ok else 0.0 for r in rho], ok


def loop_keep(ent: list[float], failed: bool, q: float) -> list[bool]:
    if not failed or q >= 1.0:
        return [True] * len(ent)
    k = math.ceil(q * len(ent))
    chosen = set(sorted(range(len(ent)), key=lambda j: (-ent[j], j))[:k])
    return [j in chosen for j in range(len(ent))]


def loop_objective(x: dict, names: dict[str, str], params: dict) -> dict[str, object]:
    """(loss, d loss / d log_probs, admitted, retained) from the per-row reference."""
    mask = x["action_mask"]
    b, t = mask.shape
    rows = [[j for j in range(t) if mask[i, j]] for i in range(b)]
    adv = loop_advantages(x["rewards"].tolist(), x["group_ids"].tolist(), names["baseline"])
    n_tokens = sum(len(p) for p in rows)
    q = params.get("entropy_failures", {}).get("q", 1.0) if names["token_filter"] != "none" else 1.0
    loss, grad = 0.0, [[0.0] * t for _ in range(b)]
    admitted, retained = [], []
    for i, pos in enumerate(rows):
        cur = [float(x["log_probs"][i, j]) for j in pos]
        st = row_stats(cur, [float(x["behavior_log_probs"][i, j]) for j in pos])
        w, ok = loop_weights(
            st, adv[i], names["trust_region"], params.get(names["trust_region"], {})
        )
        keep = loop_keep([float(x["entropies"][i, j]) for j in pos], bool(x["failures"][i]), q)
        norm = {
            "sample_mean": len(pos) * b,
            "token_mean": n_tokens,
            "constant_length": params.get("constant_length", {}).get("length", 1) * b,
        }[names["aggregation"]]
        for j, wj, kj, c in zip(pos, w, keep, cur, strict=True):
            if kj:
                loss += -wj * adv[i] * c / norm
                grad[i][j] = -wj * adv[i] / norm
        gate = (
            [d <= params[names["trust_region"]]["delta"] for d in st["d"]]
            if names["trust_region"] == "token_bernoulli_kl"
            else [ok] * len(pos)
        )
        admitted.append(ok)
        retained.append(sum(kj and g for kj, g in zip(keep, gate, strict=True)))
    return {"loss": loss, "grad": grad, "admitted": admitted, "retained": retained, "adv": adv}


# --------------------------------------------------------------------------- thresholds


def _between(values: list[float], frac: float) -> float:
    """A threshold halfway between two neighbouring sorted values near quantile `frac`."""
    s = sorted(set(values))
    k = min(max(1, int(frac * len(s))), len(s) - 1)
    return 0.5 * (s[k - 1] + s[k])


def pick_params(x: dict, tr_name: str) -> dict[str, dict]:
    """Hyper-parameters that put the gates inside the data (some rows in, some out)."""
    mask = x["action_mask"]
    stats = [
        row_stats(
            [float(v) for v in x["log_probs"][i][mask[i]]],
            [float(v) for v in x["behavior_log_probs"][i][mask[i]]],
        )
        for i in range(mask.shape[0])
    ]
    all_d = [d for st in stats for d in st["d"]]
    all_rho = [r for st in stats for r in st["rho"]]
    geo = [st["geo"] for st in stats]
    return {
        "sequence_bernoulli_kl": {"delta": _between([st["kl"] for st in stats], 0.5)},
        "token_bernoulli_kl": {"delta": _between(all_d, 0.7)},
        "sequence_k3": {"delta": _between([st["k3"] for st in stats], 0.5)},
        "geometric_ratio": {"lower": _between(geo, 0.2), "upper": _between(geo, 0.8)},
        "token_tis": {"cap": _between(all_rho, 0.6)},
        "ppo_clip": {"eps_low": 0.05, "eps_high": 0.07},
        "constant_length": {"length": 13},
        "entropy_failures": {"q": 0.6},
    }


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("filt", ["none", "entropy_failures"])
@pytest.mark.parametrize("agg", AGGREGATIONS.names())
@pytest.mark.parametrize("tr", TRUST_REGIONS.names())
def test_objective_matches_loop(tr: str, agg: str, filt: str) -> None:
    """Loss, gradient, admitted and retained_tokens equal the per-row loop (float64)."""
    seed = sum(map(ord, tr + agg + filt)) % 1000
    x = make_batch(8, 11, seed=seed, drift=0.3)
    names = {"baseline": "batch_mean", "trust_region": tr, "aggregation": agg, "token_filter": filt}
    params = pick_params(x, tr)
    ref = loop_objective(x, names, params)
    obj = Objective(**names, params=params)
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
    if tr not in ("none", "no_is", "token_tis", "ppo_clip"):
        assert 0 < sum(ref["admitted"]) < 8 or tr == "token_bernoulli_kl"  # the gate is exercised


@pytest.mark.parametrize("baseline", BASELINES.names())
def test_advantages_match_loop(baseline: str) -> None:
    x = make_batch(8, 5, seed=11)
    got = Objective(baseline=baseline).advantages(x["rewards"], x["group_ids"])
    ref = loop_advantages(x["rewards"].tolist(), x["group_ids"].tolist(), baseline)
    assert got.tolist() == pytest.approx(ref, rel=1e-12, abs=1e-14)
