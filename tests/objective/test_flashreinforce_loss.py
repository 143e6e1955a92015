"""`flashreinforce_loss`: hand-computed value, equality with the composed preset, diagnostics,
the reference's edge cases (filtered tokens, dtypes, 0-d delta) and every validation error
(each naming the argument)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.objective import make_batch

from frlab.objective import Objective, flashreinforce_loss

L = math.log
NAN, INF = float("nan"), float("inf")


def test_hand_computed_loss() -> None:
    """B = 2. Row 0: policy tokens (0, 1), log pi = (ln .4, ln .5), log mu = (ln .5, ln .5),
    rho = (0.8, 1), R = 1. Row 1: one policy token (slot 0), log pi = log mu = ln .25, R = 0.
    A = R - 0.5 = (0.5, -0.5). Both rows admitted at delta = 0.02 (KLs 0.0102 and 0).
    loss = -(1/2)[(1/2)(0.8 * 0.5 ln .4 + 1 * 0.5 ln .5) + (1/1)(1 * -0.5 ln .25)]."""
    lp = torch.tensor([[L(0.4), L(0.5)], [L(0.25), NAN]], dtype=torch.float64, requires_grad=True)
    beh = torch.tensor([[L(0.5), L(0.5)], [L(0.25), 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    loss, diag = flashreinforce_loss(lp, beh, rewards, mask, delta=0.02)
    expected = -0.5 * (0.5 * (0.8 * 0.5 * L(0.4) + 0.5 * L(0.5)) + (-0.5 * L(0.25)))
    assert loss.item() == pytest.approx(expected, rel=1e-14)
    loss.backward()
    grad = [[-0.8 * 0.5 / 4, -1.0 * 0.5 / 4], [0.5 / 2, 0.0]]
    torch.testing.assert_close(lp.grad, torch.tensor(grad, dtype=torch.float64))
    assert set(diag) == {
        "advantages",
        "sequence_kl",
        "admitted",
        "acceptance_rate",
        "policy_tokens",
        "retained_tokens",
    }
    assert diag["advantages"].tolist() == [0.5, -0.5]
    assert diag["policy_tokens"].tolist() == [2, 1] and diag["retained_tokens"].tolist() == [2, 1]
    assert diag["acceptance_rate"].item() == 1.0


@pytest.mark.parametrize("q", [1.0, 0.5])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_equals_the_composed_preset(q: float, dtype: torch.dtype) -> None:
    x = make_batch(8, 12, seed=21, drift=0.3, dtype=dtype)
    kw = {"entropies": x["entropies"], "failures": x["failures"]} if q < 1 else {}
    lp1 = x["log_probs"].clone().requires_grad_(True)
    loss1, d1 = flashreinforce_loss(
        lp1,
        x["behavior_log_probs"],
        x["rewards"],
        x["action_mask"],
        delta=0.02,
        negative_token_fraction=q,
        **kw,
    )
    loss1.backward()
    params = {"sequence_bernoulli_kl": {"delta": 0.02}, "entropy_failures": {"q": q}}
    obj = Objective.from_preset("flashreinforce", params=params)
    if q < 1:
        obj = Objective(token_filter="entropy_failures", params=params)
    lp2 = x["log_probs"].clone().requires_grad_(True)
    loss2, d2 = obj(
        lp2, x["behavior_log_probs"], obj.advantages(x["rewards"]), x["action_mask"], **kw
    )
    loss2.backward()
    assert 0 < int(d1["admitted"].sum()) < 8
    assert loss1.item() == loss2.item()
    assert torch.equal(lp1.grad, lp2.grad)
    for key in d1:
        assert torch.equal(d1[key], d2[key]), key


def test_filter_only_when_fraction_below_one() -> None:
    """q = 1 ignores entropies/failures; q < 1 changes retained_tokens but not policy_tokens."""
    x = make_batch(6, 12, seed=3)
    args = (x["log_probs"], x["behavior_log_probs"], x["rewards"], x["action_mask"])
    kw = {"entropies": x["entropies"], "failures": x["failures"], "delta": INF}
    _, full = flashreinforce_loss(*args, **kw)
    _, filt = flashreinforce_loss(*args, negative_token_fraction=0.3, **kw)
    assert torch.equal(full["retained_tokens"], full["policy_tokens"])
    assert torch.equal(filt["policy_tokens"], full["policy_tokens"])
    failed = x["failures"]
    assert (filt["retained_tokens"][failed] < full["retained_tokens"][failed]).all()
    assert torch.equal(filt["retained_tokens"][~failed], full["retained_tokens"][~failed])


# --------------------------------------------------------------------------- reference edge cases

FULL = torch.tensor([[True, True], [True, True]])


def _repro(dtype: torch.dtype = torch.float32, behavior_00: float = -100.0) -> dict:
    """The entropy-filter case: row 1 failed, q = 0.5 keeps its higher-entropy token (slot 1);
    its dropped token 0 has log-ratio -0.01 - behavior_00 (99.99 by default: exp overflows
    float32)."""
    return {
        "log_probs": torch.tensor([[-0.5, -0.5], [-0.01, -0.5]], dtype=dtype, requires_grad=True),
        "behavior_log_probs": torch.tensor([[-0.5, -0.5], [behavior_00, -0.6]], dtype=dtype),
        "rewards": torch.tensor([1.0, 0.0], dtype=dtype),
        "action_mask": FULL,
        "delta": INF,
        "negative_token_fraction": 0.5,
        "entropies": torch.tensor([[1.0, 1.0], [0.1, 2.0]], dtype=dtype),
        "failures": torch.tensor([False, True]),
    }


def test_filtered_token_is_never_exponentiated() -> None:
    """A = (0.5, -0.5), B = 2, T_i = 2. Row 0 keeps both tokens (rho = 1): -(1/2)(1/2)(0.5 * -0.5
    * 2) = 0.125. Row 1 keeps token 1 only, rho = exp(-0.5 + 0.6) = exp(0.1):
    -(1/2)(1/2)(exp(0.1) * -0.5 * -0.5) = -0.0625 exp(0.1). Loss 0.125 - 0.0625 e^0.1 = 0.05593
    (the reference's value); the dropped token's exp(99.99) (inf in float32) is never formed."""
    args = _repro()
    lp = args["log_probs"]
    loss, diag = flashreinforce_loss(**args)
    expected = 0.125 - 0.0625 * math.exp(0.1)
    assert loss.dtype == torch.float32 and round(loss.item(), 5) == 0.05593
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert diag["retained_tokens"].tolist() == [2, 1] and diag["policy_tokens"].tolist() == [2, 2]
    loss.backward()
    grad = [[-0.5 / 4, -0.5 / 4], [0.0, math.exp(0.1) * 0.5 / 4]]  # -rho A_i / (T_i B); 0: dropped
    torch.testing.assert_close(lp.grad, torch.tensor(grad), rtol=1e-6, atol=0)


def test_filtered_token_overflowing_even_in_float64_is_harmless() -> None:
    """exp(999.99) overflows float64 too: the dropped token still never reaches a weight."""
    loss, diag = flashreinforce_loss(**_repro(torch.float64, behavior_00=-1000.0))
    assert loss.item() == pytest.approx(0.125 - 0.0625 * math.exp(0.1), rel=1e-12)
    assert diag["retained_tokens"].tolist() == [2, 1]


def test_working_dtype_is_keyed_on_log_probs_alone() -> None:
    """fp32 log-probs with fp64 behaviour log-probs and rewards give an fp32 loss and fp32
    diagnostics; fp64 log-probs with fp32 rest give fp64."""
    x = make_batch(4, 6, seed=2, dtype=torch.float64)
    lp32 = x["log_probs"].float()
    loss, diag = flashreinforce_loss(lp32, x["behavior_log_probs"], x["rewards"], x["action_mask"])
    assert loss.dtype == torch.float32
    assert diag["advantages"].dtype == diag["sequence_kl"].dtype == torch.float32
    beh32, r32 = x["behavior_log_probs"].float(), x["rewards"].float()
    loss64, diag64 = flashreinforce_loss(x["log_probs"], beh32, r32, x["action_mask"])
    assert loss64.dtype == torch.float64 and diag64["sequence_kl"].dtype == torch.float64


def test_entropies_are_ranked_in_their_own_dtype() -> None:
    """fp32 log-probs, fp64 entropies (1, 1 + 1e-12) in a failed row with q = 0.5: token 1 has
    the higher entropy in float64 (a cast to float32 would tie them and keep token 0)."""
    lp = torch.tensor([[-0.7, -0.2], [-0.3, -0.4]], requires_grad=True)
    ent = torch.tensor([[1.0, 1.0], [1.0, 1.0 + 1e-12]], dtype=torch.float64)
    loss, diag = flashreinforce_loss(
        lp,
        lp.detach().clone(),
        torch.tensor([1.0, 0.0]),
        FULL,
        negative_token_fraction=0.5,
        entropies=ent,
        failures=torch.tensor([False, True]),
    )
    loss.backward()
    assert diag["retained_tokens"].tolist() == [2, 1]
    assert lp.grad[1].tolist() == [0.0, pytest.approx(0.5 / 4)]  # rho 1, A -0.5, T 2, B 2


def test_acceptance_rate_is_float32_like_the_reference() -> None:
    x = make_batch(4, 6, seed=3, dtype=torch.float64)
    _, diag = flashreinforce_loss(
        x["log_probs"], x["behavior_log_probs"], x["rewards"], x["action_mask"]
    )
    assert diag["acceptance_rate"].dtype == torch.float32
    assert diag["acceptance_rate"].item() == diag["admitted"].float().mean().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_delta_may_be_a_zero_dim_tensor(dtype: torch.dtype) -> None:
    x = make_batch(8, 12, seed=21, drift=0.3)
    args = (x["log_probs"], x["behavior_log_probs"], x["rewards"], x["action_mask"])
    loss_t, d_t = flashreinforce_loss(*args, delta=torch.tensor(0.02, dtype=dtype))
    loss_f, d_f = flashreinforce_loss(*args, delta=float(torch.tensor(0.02, dtype=dtype)))
    assert 0 < int(d_f["admitted"].sum()) < 8
    assert loss_t.item() == loss_f.item() and torch.equal(d_t["admitted"], d_f["admitted"])
    with pytest.raises(ValueError, match=r"delta must be in \[0, inf\], got -1"):
        flashreinforce_loss(*args, delta=torch.tensor(-1.0))
    with pytest.raises(ValueError, match="delta must be a real number"):
        flashreinforce_loss(*args, delta=torch.tensor([0.02]))


# --------------------------------------------------------------------------- validation


def base(nan_masked: bool = True) -> dict:
    """Valid float32 inputs; masked slots hold NaN (the token screen then raises a false
    alarm that the exact re-check clears) or zeros (the screen alone decides)."""
    x = make_batch(3, 4, seed=0, dtype=torch.float32, nan_masked=nan_masked)
    return {
        "log_probs": x["log_probs"],
        "behavior_log_probs": x["behavior_log_probs"],
        "rewards": x["rewards"],
        "action_mask": x["action_mask"],
        "entropies": x["entropies"],
        "failures": x["failures"],
    }


def first_policy(mask: torch.Tensor) -> tuple[int, int]:
    i, t = (int(v) for v in mask.nonzero()[0])
    return i, t


def _set(name: str, value: float):  # noqa: ANN202
    def edit(a: dict) -> None:
        x = a[name].clone()
        x[first_policy(a["action_mask"])] = value
        a[name] = x

    return edit


def _empty_row(a: dict) -> None:
    a["action_mask"] = a["action_mask"].clone()
    a["action_mask"][1] = False


CASES = {
    "non_2d": (lambda a: a.update(log_probs=a["log_probs"][0]), "log_probs must be 2-D"),
    "empty": (lambda a: a.update(log_probs=a["log_probs"][:, :0]), "log_probs must be non-empty"),
    "behavior_shape": (
        lambda a: a.update(behavior_log_probs=a["behavior_log_probs"][:, :2]),
        "behavior_log_probs must have the shape",
    ),
    "mask_shape": (
        lambda a: a.update(action_mask=a["action_mask"][:2]),
        "action_mask must have the shape",
    ),
    "rewards_shape": (
        lambda a: a.update(rewards=a["rewards"][:2]),
        r"rewards must have shape \[3\]",
    ),
    "mask_dtype": (
        lambda a: a.update(action_mask=a["action_mask"].int()),
        "action_mask must be a bool",
    ),
    "lp_dtype": (
        lambda a: a.update(log_probs=a["log_probs"].nan_to_num().long()),
        "log_probs must be a floating",
    ),
    "beh_dtype": (
        lambda a: a.update(behavior_log_probs=a["behavior_log_probs"].nan_to_num().int()),
        "behavior_log_probs must be a floating",
    ),
    "beh_device": (
        lambda a: a.update(behavior_log_probs=a["behavior_log_probs"].to("meta")),
        "behavior_log_probs is on meta",
    ),
    "mask_device": (
        lambda a: a.update(action_mask=a["action_mask"].to("meta")),
        "action_mask is on meta",
    ),
    "rewards_device": (lambda a: a.update(rewards=a["rewards"].to("meta")), "rewards is on meta"),
    "empty_row": (_empty_row, r"no policy token in row\(s\) \[1\]"),
    "rewards_nan": (
        lambda a: a.update(rewards=torch.tensor([0.0, NAN, 1.0])),
        r"rewards must be finite.*rewards\[1\]",
    ),
    "rewards_inf": (
        lambda a: a.update(rewards=torch.tensor([0.0, 1.0, -INF])),
        "rewards must be finite",
    ),
    "lp_nan": (_set("log_probs", NAN), "log_probs must be finite and <= 0"),
    "lp_pos": (_set("log_probs", 0.5), r"log_probs must be finite and <= 0.*=0.5"),
    "lp_inf": (_set("log_probs", INF), "log_probs must be finite and <= 0"),
    "lp_neg_inf": (_set("log_probs", -INF), "log_probs must be finite and <= 0"),
    "beh_nan": (_set("behavior_log_probs", NAN), "behavior_log_probs must be finite and <= 0"),
    "beh_pos": (_set("behavior_log_probs", 1e-3), "behavior_log_probs must be finite and <= 0"),
    "beh_neg_inf": (_set("behavior_log_probs", -INF), "behavior_log_probs must be finite and <= 0"),
}


@pytest.mark.parametrize("nan_masked", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_validation_errors(case: str, nan_masked: bool) -> None:
    edit, pattern = CASES[case]
    a = base(nan_masked)
    edit(a)
    with pytest.raises(ValueError, match=pattern):
        flashreinforce_loss(a["log_probs"], a["behavior_log_probs"], a["rewards"], a["action_mask"])


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        ({"delta": NAN}, "delta must not be NaN"),
        ({"delta": -1e-3}, r"delta must be in \[0, inf\]"),
        ({"negative_token_fraction": 1.5}, r"negative_token_fraction must be in \[0, 1\]"),
        ({"negative_token_fraction": -0.1}, "negative_token_fraction must be in"),
        ({"negative_token_fraction": NAN}, "negative_token_fraction must not be NaN"),
    ],
)
def test_hyperparameter_errors(kw: dict, pattern: str) -> None:
    a = base()
    with pytest.raises(ValueError, match=pattern):
        flashreinforce_loss(
            a["log_probs"], a["behavior_log_probs"], a["rewards"], a["action_mask"], **kw
        )


def _ent(value: float):  # noqa: ANN202
    return _set("entropies", value)


FILTER_CASES = {
    "no_entropies": (lambda a: a.update(entropies=None), "entropies"),
    "no_failures": (lambda a: a.update(failures=None), "failures"),
    "ent_shape": (
        lambda a: a.update(entropies=a["entropies"][:, :3]),
        "entropies must have the shape",
    ),
    "ent_dtype": (
        lambda a: a.update(entropies=a["entropies"].nan_to_num().long()),
        "entropies must be a floating",
    ),
    "ent_device": (lambda a: a.update(entropies=a["entropies"].to("meta")), "entropies is on meta"),
    "ent_nan": (_ent(NAN), r"entropies must be finite on policy tokens.*=nan"),
    "ent_inf": (_ent(INF), "entropies must be finite on policy tokens"),
    "fail_shape": (
        lambda a: a.update(failures=a["failures"][:2]),
        r"failures must have shape \[3\]",
    ),
    "fail_dtype": (lambda a: a.update(failures=a["failures"].float()), "failures must be a bool"),
    "fail_device": (lambda a: a.update(failures=a["failures"].to("meta")), "failures is on meta"),
}


@pytest.mark.parametrize("nan_masked", [True, False])
@pytest.mark.parametrize("case", FILTER_CASES)
def test_filter_validation_errors(case: str, nan_masked: bool) -> None:
    edit, pattern = FILTER_CASES[case]
    a = base(nan_masked)
    edit(a)
    with pytest.raises(ValueError, match=pattern):
        flashreinforce_loss(
            a["log_probs"],
            a["behavior_log_probs"],
            a["rewards"],
            a["action_mask"],
            negative_token_fraction=0.5,
            entropies=a["entropies"],
            failures=a["failures"],
        )


@pytest.mark.parametrize("nan_masked", [True, False])
def test_valid_base_case_passes(nan_masked: bool) -> None:
    """The unedited inputs of the validation tests are valid (so each case fails for its edit)."""
    a = base(nan_masked)
    loss, _ = flashreinforce_loss(
        a["log_probs"],
        a["behavior_log_probs"],
        a["rewards"],
        a["action_mask"],
        negative_token_fraction=0.5,
        entropies=a["entropies"],
        failures=a["failures"],
    )
    assert math.isfinite(loss.item())


def test_objective_call_validates_advantages() -> None:
    a = base()
    obj = Objective()
    with pytest.raises(ValueError, match="advantages must be finite"):
        obj(
            a["log_probs"], a["behavior_log_probs"], torch.tensor([0.0, NAN, 1.0]), a["action_mask"]
        )
    with pytest.raises(ValueError, match="advantages must be a float"):
        obj(a["log_probs"], a["behavior_log_probs"], torch.tensor([0, 1, 1]), a["action_mask"])
    with pytest.raises(ValueError, match="rewards must be finite"):
        obj.advantages(torch.tensor([0.0, INF]))


def test_validate_false_skips_the_checks() -> None:
    """validate=False trusts the caller: a positive log-prob goes through unchecked."""
    a = base()
    _set("log_probs", 0.5)(a)
    obj = Objective(validate=False)
    loss, _ = obj(
        a["log_probs"], a["behavior_log_probs"], obj.advantages(a["rewards"]), a["action_mask"]
    )
    assert math.isfinite(loss.item())
