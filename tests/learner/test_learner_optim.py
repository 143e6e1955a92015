"""AdamW construction and the cosine / constant per-update schedules."""

from __future__ import annotations

import math

import pytest
import torch

from frlab.learner.optim import build_optimizer, build_scheduler, grad_clip_norm
from frlab.registry import RegistryError

BASE_LR = 1e-3


def _optimizer() -> torch.optim.AdamW:
    return build_optimizer([torch.nn.Parameter(torch.zeros(3))], lr=BASE_LR)


def _lrs(scheduler: str, max_steps: int, **kw: float) -> list[float]:
    opt = _optimizer()
    sched = build_scheduler(opt, scheduler=scheduler, max_steps=max_steps, **kw)
    out = []
    for _ in range(max_steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_cosine_warmup_then_decay_to_min_ratio() -> None:
    lrs = _lrs("cosine", 20, warmup_ratio=0.2, min_lr_ratio=0.1)
    # 4 warmup updates: lr * (s + 1) / 4.
    assert lrs[:4] == pytest.approx([BASE_LR * k / 4 for k in (1, 2, 3, 4)], rel=1e-12)
    # Cosine from the full lr (update 4) down to exactly min_lr_ratio * lr (last update).
    span = 20 - 4 - 1
    expected = [
        BASE_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 4) / span))) for s in range(4, 20)
    ]
    assert lrs[4:] == pytest.approx(expected, rel=1e-12)
    assert lrs[-1] == pytest.approx(0.1 * BASE_LR, rel=1e-12)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:], strict=False))


def test_cosine_without_warmup_starts_at_full_lr() -> None:
    lrs = _lrs("cosine", 5, warmup_ratio=0.0, min_lr_ratio=0.0)
    assert lrs[0] == pytest.approx(BASE_LR)
    assert lrs[2] == pytest.approx(BASE_LR * 0.5)
    assert lrs[-1] == pytest.approx(0.0, abs=1e-18)


def test_constant_with_and_without_warmup() -> None:
    assert _lrs("constant", 6) == pytest.approx([BASE_LR] * 6)
    lrs = _lrs("constant", 10, warmup_ratio=0.3, min_lr_ratio=0.5)
    assert lrs == pytest.approx([BASE_LR / 3, 2 * BASE_LR / 3] + [BASE_LR] * 8)


def test_constant_without_horizon_is_allowed_cosine_is_not() -> None:
    opt = _optimizer()
    sched = build_scheduler(opt, scheduler="constant", max_steps=None)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == BASE_LR
    with pytest.raises(ValueError, match="needs max_steps"):
        build_scheduler(_optimizer(), scheduler="cosine", max_steps=None)


def test_scheduler_state_round_trip_continues() -> None:
    opt = _optimizer()
    sched = build_scheduler(opt, scheduler="cosine", max_steps=10, warmup_ratio=0.2)
    for _ in range(4):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2 = _optimizer()
    sched2 = build_scheduler(opt2, scheduler="cosine", max_steps=10, warmup_ratio=0.2)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(state)
    opt.step(), sched.step(), opt2.step(), sched2.step()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_adamw_hyperparameters_are_applied() -> None:
    opt = build_optimizer(
        [torch.nn.Parameter(torch.ones(2))],
        lr=0.5,
        weight_decay=0.1,
        betas=[0.8, 0.9],
        eps=1e-6,
        grad_clip=1.0,
        scheduler="cosine",
        warmup_ratio=0.1,
        min_lr_ratio=0.1,
    )
    group = opt.param_groups[0]
    assert isinstance(opt, torch.optim.AdamW)
    assert (group["lr"], group["weight_decay"], group["betas"], group["eps"]) == (
        0.5,
        0.1,
        (0.8, 0.9),
        1e-6,
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"lr": 0.0}, "optim.lr"),
        ({"lr": float("nan")}, "optim.lr"),
        ({"lr": 1e-3, "weight_decay": -1.0}, "optim.weight_decay"),
        ({"lr": 1e-3, "betas": [0.9]}, "optim.betas"),
        ({"lr": 1e-3, "betas": [0.9, 1.0]}, "optim.betas"),
        ({"lr": 1e-3, "eps": 0.0}, "optim.eps"),
        ({"lr": 1e-3, "weight_decy": 0.1}, "weight_decay"),
    ],
)
def test_bad_optimizer_config_names_the_key(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"scheduler": "cosine", "max_steps": 0}, "max_steps"),
        ({"scheduler": "cosine", "max_steps": 5, "warmup_ratio": 1.0}, "optim.warmup_ratio"),
        ({"scheduler": "cosine", "max_steps": 5, "min_lr_ratio": 1.5}, "optim.min_lr_ratio"),
        ({"scheduler": "constant", "max_steps": None, "warmup_ratio": 0.1}, "needs max_steps"),
    ],
)
def test_bad_scheduler_config_names_the_key(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        build_scheduler(_optimizer(), **kwargs)


def test_unknown_scheduler_suggests_close_match() -> None:
    with pytest.raises(RegistryError, match="optim.scheduler.*did you mean 'cosine'"):
        build_scheduler(_optimizer(), scheduler="cosin", max_steps=5)


def test_grad_clip_values() -> None:
    assert grad_clip_norm(1.0) == 1.0
    assert grad_clip_norm(None) == math.inf
    assert grad_clip_norm(0) == math.inf
    with pytest.raises(ValueError, match="optim.grad_clip"):
        grad_clip_norm(-1.0)


def test_every_default_a_python_caller_gets_is_the_config_schemas() -> None:
    """`FlashReinforceModule(..., optim={"lr": ...})` trains as the command line does: each
    optim key left out takes the schema's default, and the builders' keyword defaults agree."""
    import dataclasses
    import inspect

    from frlab.config.schema import OptimConfig
    from frlab.learner.optim import OPTIM_DEFAULTS

    schema = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
              for f in dataclasses.fields(OptimConfig) if not f.name.startswith("_")}  # fmt: skip
    for key, value in OPTIM_DEFAULTS.items():
        expected = schema[key]
        assert (list(value) if isinstance(value, tuple) else value) == expected, key
    assert set(schema) - set(OPTIM_DEFAULTS) == {"lr"}  # the one key without a default here
    for fn in (build_optimizer, build_scheduler):
        for name, param in inspect.signature(fn).parameters.items():
            if name in schema and param.default is not inspect.Parameter.empty:
                default = param.default
                assert (list(default) if isinstance(default, tuple) else default) == schema[name], (
                    name
                )


def test_fused_only_when_every_parameter_is_a_floating_cuda_tensor() -> None:
    from types import SimpleNamespace

    from frlab.learner.optim import fused_where_offered

    def param(cuda: bool, floating: bool = True) -> SimpleNamespace:
        return SimpleNamespace(is_cuda=cuda, is_floating_point=lambda: floating)

    assert fused_where_offered([param(True), param(True)]) == {"fused": True}
    assert fused_where_offered([param(True), param(False)]) == {}
    assert fused_where_offered([param(True, floating=False)]) == {}
    assert fused_where_offered([]) == {}
    cpu = [torch.nn.Parameter(torch.zeros(2))]
    assert fused_where_offered(cpu) == {}
    assert build_optimizer(cpu, lr=BASE_LR).defaults["fused"] is None  # torch's default


def test_make_optimizer_fuses_torchs_adamw_unless_the_node_says_otherwise(monkeypatch) -> None:
    import functools

    from frlab.learner import optim

    monkeypatch.setattr(optim, "fused_where_offered", lambda params: {"fused": True})
    params = [torch.nn.Parameter(torch.zeros(2))]
    adamw = functools.partial(torch.optim.AdamW, lr=BASE_LR)
    assert optim.make_optimizer(adamw, params).defaults["fused"] is True
    unfused = functools.partial(torch.optim.AdamW, lr=BASE_LR, fused=False)
    assert optim.make_optimizer(unfused, params).defaults["fused"] is False
    foreach = functools.partial(torch.optim.AdamW, lr=BASE_LR, foreach=True)
    assert optim.make_optimizer(foreach, params).defaults["fused"] is None
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    assert isinstance(optim.make_optimizer(sgd, params), torch.optim.SGD)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_parameters_get_fused_adamw() -> None:
    import functools

    from frlab.learner.optim import make_optimizer

    params = [torch.nn.Parameter(torch.zeros(2, device="cuda"))]
    adamw = functools.partial(torch.optim.AdamW, lr=BASE_LR)
    assert make_optimizer(adamw, params).defaults["fused"] is True
    assert build_optimizer(params, lr=BASE_LR).defaults["fused"] is True
