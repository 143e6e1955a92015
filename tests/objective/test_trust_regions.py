"""Trust regions: exact hand-computed weights, gates, diagnostics, overflow, NaN safety."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.objective import make_batch

from frlab.objective import TRUST_REGIONS, TokenBatch

L = math.log
# One row, two policy tokens and one masked slot holding NaN:
# behaviour p = (0.5, 0.5), current q = (0.4, 0.5)  =>  rho = (0.8, 1.0).
CUR = torch.tensor([[L(0.4), L(0.5), float("nan")]], dtype=torch.float64)
BEH = torch.tensor([[L(0.5), L(0.5), float("nan")]], dtype=torch.float64)
MASK = torch.tensor([[True, True, False]])
POS = torch.tensor([1.0], dtype=torch.float64)
# d_1 = 0.5 ln(0.5/0.4) + 0.5 ln(0.5/0.6) (KL of behaviour from current), d_2 = 0.
D1 = 0.5 * L(0.5 / 0.4) + 0.5 * L(0.5 / 0.6)
SEQ_KL = D1 / 2  # = 0.0102054997...


def tr(name: str, **kw: float):
    return TRUST_REGIONS.build(name, **kw)


def apply(component, cur, beh, adv, mask, keep=None):  # noqa: ANN001, ANN201
    return component(TokenBatch(cur, beh, adv, mask, keep))


def run(name: str, cur=CUR, beh=BEH, adv=POS, mask=MASK, keep=None, **kw: float):  # noqa: ANN001
    return apply(tr(name, **kw), cur, beh, adv, mask, keep)


def test_sequence_bernoulli_kl_hand_values() -> None:
    """sequence_kl = (d_1 + 0) / T = 0.0102055; delta 0.011 admits (weights = rho = [0.8, 1]),
    delta 0.010 rejects (weights 0). The reverse direction KL(q||p) would be 0.0201355 / 2."""
    out = run("sequence_bernoulli_kl", delta=0.011)
    assert TokenBatch(CUR, BEH, POS, MASK).sequence_kl.item() == pytest.approx(SEQ_KL, rel=1e-12)
    assert SEQ_KL != pytest.approx((0.4 * L(0.4 / 0.5) + 0.6 * L(0.6 / 0.5)) / 2, rel=1e-3)
    assert out.admitted.tolist() == [True]
    assert out.weights[0].tolist() == pytest.approx([0.8, 1.0, 0.0], rel=1e-14)
    rejected = run("sequence_bernoulli_kl", delta=0.010)
    assert rejected.admitted.tolist() == [False]
    assert torch.equal(rejected.weights, torch.zeros(1, 3, dtype=torch.float64))


def test_sequence_bernoulli_kl_inclusive_and_inf() -> None:
    """Identical policies give sequence_kl exactly 0, admitted at delta = 0 (<= is inclusive);
    delta = inf admits a row whose KL is huge."""
    out = run("sequence_bernoulli_kl", cur=BEH.clone(), delta=0.0)
    assert TokenBatch(BEH, BEH, POS, MASK).sequence_kl.item() == 0.0 and out.admitted.item()
    far = torch.tensor([[L(0.01), L(0.9), 0.0]], dtype=torch.float64)
    assert run("sequence_bernoulli_kl", cur=far, delta=math.inf).admitted.item()
    assert not run("sequence_bernoulli_kl", cur=far, delta=1e-3).admitted.item()


def test_probabilities_are_clamped() -> None:
    """Behaviour log p = 0 (p = 1) is clamped to 1 - 1e-6, current q = 0.5 stays:
    d = (1 - e) ln((1 - e) / 0.5) + e ln(e / 0.5), e = 1e-6; T = 1."""
    e = 1e-6
    expected = (1 - e) * L((1 - e) / 0.5) + e * L(e / 0.5)
    batch = TokenBatch(
        torch.tensor([[L(0.5)]], dtype=torch.float64),
        torch.tensor([[0.0]], dtype=torch.float64),
        POS,
        torch.tensor([[True]]),
    )
    assert batch.sequence_kl.item() == pytest.approx(expected, rel=1e-9)


def test_none_is_plain_token_is() -> None:
    out = run("none")
    assert out.admitted.tolist() == [True]
    assert out.weights[0].tolist() == pytest.approx([0.8, 1.0, 0.0], rel=1e-14)


def test_no_is_weights_one() -> None:
    """Ratio against the detached current policy: 1 on policy tokens, 0 elsewhere, no gate."""
    out = run("no_is")
    assert out.weights.tolist() == [[1.0, 1.0, 0.0]] and out.admitted.tolist() == [True]
    assert not TRUST_REGIONS.get("no_is").off_policy_correction
    assert TRUST_REGIONS.get("none").off_policy_correction


def test_token_bernoulli_kl_masks_tokens() -> None:
    """d = (0.0204, 0): delta 0.01 keeps only token 2 (weight rho = 1); half the tokens pass."""
    out = run("token_bernoulli_kl", delta=0.01)
    assert out.token_admitted.tolist() == [[False, True, False]]
    assert out.weights.tolist() == [[0.0, 1.0, 0.0]]
    assert out.admitted.tolist() == [True]
    assert out.diagnostics["token_acceptance_rate"].item() == 0.5
    assert run("token_bernoulli_kl", delta=0.03).weights[0, 0].item() == pytest.approx(0.8)


def test_sequence_k3_hand_values() -> None:
    """k3 = rho - 1 - ln rho = (0.8 - 1 - ln 0.8, 0); mean over T = 2 is 0.0115718."""
    k3 = (0.8 - 1 - L(0.8)) / 2
    out = run("sequence_k3", delta=0.012)
    assert out.diagnostics["sequence_k3"].item() == pytest.approx(k3, rel=1e-12)
    assert out.admitted.item() and out.weights[0, 0].item() == pytest.approx(0.8)
    assert not run("sequence_k3", delta=0.011).admitted.item()


def test_geometric_ratio_bounds() -> None:
    """exp(mean log rho) = exp(ln(0.8) / 2) = sqrt(0.8) = 0.894427: inside [0.89, 1.1] only."""
    out = run("geometric_ratio", lower=0.89, upper=1.1)
    assert out.diagnostics["geometric_ratio"].item() == pytest.approx(math.sqrt(0.8), rel=1e-12)
    assert out.admitted.item()
    assert not run("geometric_ratio", lower=0.9, upper=1.1).admitted.item()
    up = run("geometric_ratio", cur=BEH, beh=CUR, lower=0.5, upper=1.1)  # ratio 1/sqrt(0.8)
    assert not up.admitted.item()


def test_token_tis_truncates() -> None:
    """min(rho, 0.9) = (0.8, 0.9); one of two tokens was truncated."""
    out = run("token_tis", cap=0.9)
    assert out.weights[0].tolist() == pytest.approx([0.8, 0.9, 0.0])
    assert out.diagnostics["truncated_fraction"].item() == 0.5


def test_ppo_clip_hand_values() -> None:
    """rho = (0.7, 1.3, 1.0), eps 0.2: A > 0 clips 1.3 > 1.2; A < 0 clips 0.7 < 0.8; A = 0 none."""
    cur = torch.tensor([[L(0.7), L(1.3), 0.0]] * 3, dtype=torch.float64)
    beh = torch.zeros(3, 3, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    out = apply(tr("ppo_clip"), cur, beh, adv, torch.ones(3, 3, dtype=torch.bool))
    expected = [[0.7, 0.0, 1.0], [0.0, 1.3, 1.0], [0.7, 1.3, 1.0]]
    torch.testing.assert_close(out.weights, torch.tensor(expected, dtype=torch.float64))
    assert out.diagnostics["clip_fraction"].item() == pytest.approx(2 / 9)


def test_ppo_clip_gradient_equals_clipped_surrogate() -> None:
    """Autograd of -min(rho A, clip(rho, 1 - el, 1 + eh) A) equals that of -w A log pi."""
    x = make_batch(5, 8, seed=3, drift=0.4, nan_masked=False)
    mask, beh = x["action_mask"], x["behavior_log_probs"]
    adv = torch.tensor([1.0, -2.0, 0.5, -0.3, 0.0], dtype=torch.float64)
    lp1 = x["log_probs"].clone().requires_grad_(True)
    rho = torch.exp(lp1 - beh)
    surrogate = -torch.minimum(rho * adv[:, None], rho.clamp(0.8, 1.3) * adv[:, None])
    torch.where(mask, surrogate, 0.0).sum().backward()
    lp2 = x["log_probs"].clone().requires_grad_(True)
    w = apply(tr("ppo_clip", eps_low=0.2, eps_high=0.3), lp2, beh, adv, mask).weights
    torch.where(mask, -w * adv[:, None] * lp2, 0.0).sum().backward()
    torch.testing.assert_close(lp2.grad, lp1.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", TRUST_REGIONS.names())
def test_common_contract(name: str) -> None:
    """Every trust region: exactly its declared diagnostics with the declared shapes, detached
    weights that are 0 and finite off the mask (NaN there), admitted [B] bool, weights on the
    input dtype."""
    x = make_batch(6, 9, seed=1)
    lp = x["log_probs"].clone().requires_grad_(True)
    out = apply(tr(name), lp, x["behavior_log_probs"], x["rewards"] - 1.0, x["action_mask"])
    declared = {d.name: d.per for d in TRUST_REGIONS.get(name).diagnostics}
    assert set(out.diagnostics) == set(declared)
    for key, per in declared.items():
        assert out.diagnostics[key].shape == ((6,) if per == "row" else ())
    assert not out.weights.requires_grad and out.weights.dtype == torch.float64
    assert torch.isfinite(out.weights).all()
    assert torch.equal(
        out.weights[~x["action_mask"]], torch.zeros_like(out.weights[~x["action_mask"]])
    )
    assert out.admitted.dtype == torch.bool and out.admitted.shape == (6,)
    assert all(not v.requires_grad for v in out.diagnostics.values())


@pytest.mark.parametrize(
    "name", ["sequence_bernoulli_kl", "none", "sequence_k3", "geometric_ratio"]
)
def test_ratio_overflow_on_admitted_token_raises(name: str) -> None:
    """float32: behaviour log-prob -200 vs current 0 gives rho = exp(200) = inf."""
    cur = torch.tensor([[0.0, -0.1]])
    beh = torch.tensor([[-200.0, -0.1]])
    kw = {"delta": math.inf} if "kl" in name or "k3" in name else {}
    if name == "geometric_ratio":
        kw = {"lower": 0.0, "upper": math.inf}
    with pytest.raises(FloatingPointError, match="row"):
        apply(tr(name, **kw), cur, beh, torch.ones(1), torch.ones(1, 2, dtype=torch.bool))


def test_overflow_on_rejected_row_is_fine() -> None:
    cur, beh = torch.tensor([[0.0, -0.1]]), torch.tensor([[-200.0, -0.1]])
    out = run("sequence_bernoulli_kl", cur, beh, torch.ones(1), torch.ones(1, 2, dtype=torch.bool))
    assert not out.admitted.item() and torch.equal(out.weights, torch.zeros(1, 2))


@pytest.mark.parametrize(
    ("name", "kw", "field"),
    [
        ("sequence_bernoulli_kl", {"delta": float("nan")}, "delta"),
        ("sequence_bernoulli_kl", {"delta": -1e-3}, "delta"),
        ("sequence_bernoulli_kl", {"delta": "3e-3"}, "delta"),
        ("token_bernoulli_kl", {"delta": -1.0}, "delta"),
        ("sequence_k3", {"delta": float("nan")}, "delta"),
        ("geometric_ratio", {"lower": 1.1, "upper": 1.0}, "lower"),
        ("geometric_ratio", {"lower": -0.1}, "lower"),
        ("token_tis", {"cap": 0.0}, "cap"),
        ("token_tis", {"cap": math.inf}, "cap"),
        ("ppo_clip", {"eps_low": 1.5}, "eps_low"),
        ("ppo_clip", {"eps_high": -0.1}, "eps_high"),
    ],
)
def test_hyperparameter_validation(name: str, kw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        tr(name, **kw)


def test_unknown_kwarg_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="bad arguments for trust_region 'none'"):
        TRUST_REGIONS.build("none", delta=1e-3)
