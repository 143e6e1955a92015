"""`Objective`: composition by name, presets, config node, registry errors, numerics,
diagnostics and global-batch (micro-batch) exactness for every trust region and aggregation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from helpers.objective import make_batch
from omegaconf import OmegaConf

from frlab.objective import (
    AGGREGATIONS,
    PRESETS,
    TOKEN_FILTERS,
    TRUST_REGIONS,
    Diagnostic,
    Objective,
    TrustRegion,
    sampled_logprobs_and_entropy,
)
from frlab.objective.baselines import BatchMean
from frlab.registry import RegistryError

KW = {
    "constant_length": {"length": 16},
    "entropy_failures": {"q": 0.5},
    "sequence_bernoulli_kl": {"delta": 2e-2},
    "token_bernoulli_kl": {"delta": 2e-2},
    "sequence_k3": {"delta": 2e-2},
    "geometric_ratio": {"lower": 0.9, "upper": 1.1},
    "ppo_clip": {"eps_low": 0.05, "eps_high": 0.05},
    "token_tis": {"cap": 1.05},
}


def call(obj: Objective, x: dict, lp: torch.Tensor, adv: torch.Tensor | None = None, **kw):  # noqa: ANN003
    adv = obj.advantages(x["rewards"], x["group_ids"]) if adv is None else adv
    return obj(
        lp,
        x["behavior_log_probs"],
        adv,
        x["action_mask"],
        entropies=x["entropies"],
        failures=x["failures"],
        **kw,
    )


# --------------------------------------------------------------------------- construction


def test_presets() -> None:
    assert PRESETS["flashreinforce"] == {
        "baseline": "batch_mean",
        "trust_region": "sequence_bernoulli_kl",
        "aggregation": "sample_mean",
        "token_filter": "none",
    }
    assert PRESETS["pg_is"]["trust_region"] == "none"
    assert (PRESETS["grpo"]["baseline"], PRESETS["grpo"]["trust_region"]) == (
        "group_mean_std",
        "ppo_clip",
    )
    assert PRESETS["dr_grpo"]["aggregation"] == "constant_length"
    assert PRESETS["rloo"]["baseline"] == "rloo"
    for name, chosen in PRESETS.items():
        assert Objective.from_preset(name, params=KW).names == chosen


def test_unknown_preset_lists_names_and_close_matches() -> None:
    with pytest.raises(
        RegistryError, match=r"registered: dr_grpo, flashreinforce.*did you mean 'flashreinforce'"
    ):
        Objective.from_preset("flashreinforc")


def test_unknown_component_name_lists_names_and_close_matches() -> None:
    with pytest.raises(RegistryError) as err:
        Objective(trust_region="sequence_bernouli_kl")
    text = str(err.value)
    assert f"registered: {', '.join(sorted(TRUST_REGIONS.names()))};" in text
    assert "did you mean 'sequence_bernoulli_kl'" in text


def test_duplicate_registration_raises() -> None:
    @dataclass(frozen=True)
    class Again(TrustRegion):
        """Admit all."""

    with pytest.raises(RegistryError, match="already registered"):
        TRUST_REGIONS.register("sequence_bernoulli_kl")(Again)
    assert TRUST_REGIONS.get("sequence_bernoulli_kl") is not Again


class _NotFrozen(TrustRegion):
    """Admit all."""


@dataclass
class _Mutable(TrustRegion):
    """Admit all."""


@dataclass(frozen=True)
class _NoDoc(TrustRegion):
    pass


@dataclass(frozen=True)
class _Undeclared(TrustRegion):
    """Admit all."""

    cap: float = 2.0


@dataclass(frozen=True)
class _Reserved(TrustRegion):
    """Admit all."""

    diagnostics = (Diagnostic("sequence_kl", "clashes with the objective's own"),)


@pytest.mark.parametrize(
    ("cls", "pattern"),
    [
        (BatchMean, "must subclass frlab.objective.TrustRegion"),
        (_NotFrozen, r"@dataclass\(frozen=True\)"),
        (_Mutable, r"@dataclass\(frozen=True\)"),
        (_NoDoc, "needs a docstring"),
        (_Undeclared, r"_Undeclared.cap .*hyperparameter\(\.\.\.\)"),
        (_Reserved, "reported by the objective itself"),
    ],
)
def test_registration_refuses_malformed_components(cls: type, pattern: str) -> None:
    with pytest.raises(RegistryError, match=pattern):
        TRUST_REGIONS.register("malformed_test_component")(cls)
    assert "malformed_test_component" not in TRUST_REGIONS


def test_params_are_keyed_by_component_name_and_do_not_leak() -> None:
    """token_tis.cap is ignored when `none` is chosen; the chosen gate reads its own delta."""
    obj = Objective(trust_region="none", params={"token_tis": {"cap": -5.0}})
    assert obj.names["trust_region"] == "none"
    assert Objective(params={"sequence_bernoulli_kl": {"delta": 0.5}}).trust_region.delta == 0.5
    with pytest.raises(ValueError, match="bad arguments for trust_region 'sequence_bernoulli_kl'"):
        Objective(params={"sequence_bernoulli_kl": {"detla": 0.5}})
    with pytest.raises(ValueError, match="params"):
        Objective(params={"sequence_bernoulli_kl": 0.5})


def test_from_config_dictconfig() -> None:
    node = OmegaConf.create(
        {
            "baseline": "batch_mean",
            "trust_region": "token_tis",
            "aggregation": "constant_length",
            "token_filter": "entropy_failures",
            "sequence_bernoulli_kl": {"delta": 3.0e-3},
            "token_tis": {"cap": 3.0},
            "constant_length": {"length": 64},
            "entropy_failures": {"q": 0.9},
        }
    )
    obj = Objective.from_config(node)
    assert obj.names == {
        "baseline": "batch_mean",
        "trust_region": "token_tis",
        "aggregation": "constant_length",
        "token_filter": "entropy_failures",
    }
    assert (
        obj.trust_region.cap == 3.0 and obj.aggregation.length == 64 and obj.token_filter.q == 0.9
    )


def test_from_config_errors_name_the_key() -> None:
    with pytest.raises(
        RegistryError, match=r"config key `objective.trust_region`.*did you mean 'token_tis'"
    ):
        Objective.from_config({"trust_region": "token_tiss"})
    with pytest.raises(ValueError, match=r"objective.sequence_bernouli_kl"):
        Objective.from_config({"sequence_bernouli_kl": {"delta": 1e-3}})
    with pytest.raises(ValueError, match=r"objective.sequence_bernoulli_kl must be a mapping"):
        Objective.from_config({"sequence_bernoulli_kl": 1e-3})
    with pytest.raises(ValueError, match="sequence_bernoulli_kl.delta"):
        Objective.from_config({"sequence_bernoulli_kl": {"delta": "3e-3"}})  # YAML 1.1 string


def test_properties() -> None:
    assert not Objective().needs_entropies
    assert Objective(
        token_filter="entropy_failures", params={"entropy_failures": {"q": 0.9}}
    ).needs_entropies
    assert not Objective(token_filter="entropy_failures").needs_entropies  # q = 1 keeps all
    assert Objective.from_preset("grpo").is_group_baseline and not Objective().is_group_baseline
    assert Objective().uses_off_policy_correction
    assert not Objective(trust_region="no_is").uses_off_policy_correction
    assert "sequence_bernoulli_kl" in repr(Objective())


def test_logprob_helper_is_re_exported() -> None:
    from frlab.ops.logprobs import sampled_logprobs_and_entropy as direct

    assert sampled_logprobs_and_entropy is direct


# --------------------------------------------------------------------------- maths


def test_gradient_is_minus_rho_a_over_t_b() -> None:
    """flashreinforce: d loss / d log_probs = -rho A_i / (T_i B) on admitted policy tokens, 0
    elsewhere (rejected rows, masked slots)."""
    x = make_batch(8, 10, seed=5, drift=0.3)
    obj = Objective(params={"sequence_bernoulli_kl": {"delta": 0.02}})
    lp = x["log_probs"].clone().requires_grad_(True)
    loss, diag = call(obj, x, lp)
    loss.backward()
    mask, adm = x["action_mask"], diag["admitted"]
    assert 0 < int(adm.sum()) < 8
    rho = torch.exp(torch.where(mask, x["log_probs"] - x["behavior_log_probs"], 0.0))
    t_i = mask.sum(1, keepdim=True).double()
    expected = torch.where(mask & adm[:, None], -rho * diag["advantages"][:, None] / (t_i * 8), 0.0)
    torch.testing.assert_close(lp.grad, expected, rtol=1e-12, atol=0)


def test_equal_rewards_give_exact_zero_loss_and_grad() -> None:
    x = make_batch(6, 9, seed=2, dtype=torch.float32)
    x["rewards"] = torch.full((6,), 7.3)
    lp = x["log_probs"].clone().requires_grad_(True)
    loss, _ = call(Objective(params={"sequence_bernoulli_kl": {"delta": math.inf}}), x, lp)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros_like(lp.grad))


def test_every_row_rejected_gives_exact_zero() -> None:
    x = make_batch(6, 9, seed=2, drift=0.5)
    lp = x["log_probs"].clone().requires_grad_(True)
    loss, diag = call(Objective(params={"sequence_bernoulli_kl": {"delta": 0.0}}), x, lp)
    loss.backward()
    assert not diag["admitted"].any() and diag["acceptance_rate"].item() == 0.0
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros_like(lp.grad))
    assert torch.equal(diag["retained_tokens"], torch.zeros(6, dtype=torch.long))


@pytest.mark.parametrize("tr", TRUST_REGIONS.names())
def test_nan_and_inf_in_masked_slots_are_harmless(tr: str) -> None:
    """NaN / +-inf in masked log-probs, behaviour log-probs and entropies: finite loss and grad,
    identical to the same batch with zeros there."""
    x = make_batch(6, 9, seed=4, nan_masked=False)
    dirty = dict(x)
    m = ~x["action_mask"]
    for key, fill in (
        ("log_probs", math.nan),
        ("behavior_log_probs", math.inf),
        ("entropies", -math.inf),
    ):
        dirty[key] = x[key].masked_fill(m, fill)
    obj = Objective(trust_region=tr, token_filter="entropy_failures", params=KW)
    grads, losses = [], []
    for batch in (x, dirty):
        lp = batch["log_probs"].clone().requires_grad_(True)
        loss, _ = call(obj, batch, lp)
        loss.backward()
        losses.append(loss.item())
        grads.append(lp.grad)
    assert math.isfinite(losses[1]) and torch.isfinite(grads[1]).all()
    assert losses[0] == losses[1] and torch.equal(grads[0], grads[1])


def test_dtypes_and_no_gradient_into_behaviour_or_rewards() -> None:
    """float64 stays float64; bf16 is computed in float32 (equal to upcasting first); the
    behaviour log-probs and rewards get no gradient."""
    x = make_batch(5, 7, seed=6)
    obj = Objective(params={"sequence_bernoulli_kl": {"delta": math.inf}})
    beh = x["behavior_log_probs"].clone().requires_grad_(True)
    rewards = x["rewards"].clone().requires_grad_(True)
    lp = x["log_probs"].clone().requires_grad_(True)
    loss, diag = obj(lp, beh, obj.advantages(rewards), x["action_mask"])
    loss.backward()
    assert loss.dtype == torch.float64 and diag["sequence_kl"].dtype == torch.float64
    assert beh.grad is None and rewards.grad is None and lp.grad is not None
    lp16 = x["log_probs"].to(torch.bfloat16).requires_grad_(True)
    beh16 = x["behavior_log_probs"].to(torch.bfloat16)
    loss16, _ = obj(lp16, beh16, obj.advantages(x["rewards"].bfloat16()), x["action_mask"])
    loss16.backward()
    lp32 = lp16.detach().float().requires_grad_(True)
    loss32, _ = obj(lp32, beh16.float(), obj.advantages(x["rewards"].float()), x["action_mask"])
    loss32.backward()
    assert loss16.dtype == torch.float32 and loss16.item() == loss32.item()
    assert lp16.grad.dtype == torch.bfloat16
    torch.testing.assert_close(lp16.grad, lp32.grad.bfloat16())


def test_diagnostics_contract() -> None:
    x = make_batch(6, 9, seed=8, drift=0.3)
    obj = Objective(token_filter="entropy_failures", params=KW)
    lp = x["log_probs"].clone().requires_grad_(True)
    _, diag = call(obj, x, lp)
    for key, shape in (
        ("advantages", (6,)),
        ("sequence_kl", (6,)),
        ("admitted", (6,)),
        ("acceptance_rate", ()),
        ("policy_tokens", (6,)),
        ("retained_tokens", (6,)),
    ):
        assert diag[key].shape == shape and not diag[key].requires_grad
    assert torch.equal(diag["policy_tokens"], x["action_mask"].sum(1))
    assert diag["acceptance_rate"].item() == pytest.approx(diag["admitted"].double().mean().item())
    keep = obj.token_filter(x["action_mask"], x["entropies"], x["failures"])
    expected = torch.where(diag["admitted"], keep.sum(1), 0)
    assert torch.equal(diag["retained_tokens"], expected)
    assert (diag["retained_tokens"] < diag["policy_tokens"]).any()


# --------------------------------------------------------------------------- global batch


@pytest.mark.parametrize("filt", TOKEN_FILTERS.names())
@pytest.mark.parametrize("agg", AGGREGATIONS.names())
@pytest.mark.parametrize("tr", TRUST_REGIONS.names())
def test_micro_batches_sum_to_the_full_batch(tr: str, agg: str, filt: str) -> None:
    """Advantages once on the full batch; micro-batches of 3, 1, 4 rows with global num_sequences
    and num_tokens: summed losses and gradients equal the full-batch ones."""
    x = make_batch(8, 10, seed=9, drift=0.2)
    obj = Objective(baseline="rloo", trust_region=tr, aggregation=agg, token_filter=filt, params=KW)
    adv = obj.advantages(x["rewards"], x["group_ids"])
    lp = x["log_probs"].clone().requires_grad_(True)
    full, _ = call(obj, x, lp, adv)
    full.backward()
    n_tok = int(x["action_mask"].sum())
    lp_mb = x["log_probs"].clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):
        part = {k: v[rows] for k, v in x.items()}
        loss, _ = call(obj, part, lp_mb[rows], adv[rows], num_sequences=8, num_tokens=n_tok)
        total = total + loss
    total.backward()
    assert full.item() != 0.0
    assert total.item() == pytest.approx(full.item(), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(lp_mb.grad, lp.grad, rtol=1e-12, atol=1e-15)


def test_global_normalisers_are_checked() -> None:
    x = make_batch(4, 6, seed=1)
    obj = Objective()
    lp = x["log_probs"]
    with pytest.raises(ValueError, match="num_sequences"):
        call(obj, x, lp, num_sequences=3)
    with pytest.raises(ValueError, match="num_tokens"):
        call(obj, x, lp, num_tokens=int(x["action_mask"].sum()) - 1)
    with pytest.raises(ValueError, match="num_tokens"):
        call(obj, x, lp, num_tokens=0)
