"""The optimizer factory (fused AdamW on CUDA) and the cosine / constant per-update schedules."""

from __future__ import annotations

import math

import pytest
import torch

from frlab.learner.optim import build_scheduler, make_optimizer
from frlab.registry import RegistryError

BASE_LR = 1e-3


def _optimizer() -> torch.optim.AdamW:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=BASE_LR)


def _lrs(scheduler: str, max_steps: int, warmup_ratio: float = 0.0, min_lr_ratio: float = 0.0):
    opt = _optimizer()
    sched = build_scheduler(
        opt,
        scheduler=scheduler,
        max_steps=max_steps,
        warmup_ratio=warmup_ratio,
        min_lr_ratio=min_lr_ratio,
    )
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


def schedule(opt: torch.optim.Optimizer):
    return build_scheduler(opt, scheduler="cosine", max_steps=10, warmup_ratio=0.2, min_lr_ratio=0)


def test_scheduler_state_round_trip_continues() -> None:
    opt = _optimizer()
    sched = schedule(opt)
    for _ in range(4):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2 = _optimizer()
    sched2 = schedule(opt2)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(state)
    opt.step(), sched.step(), opt2.step(), sched2.step()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_unknown_scheduler_suggests_close_match() -> None:
    with pytest.raises(RegistryError, match="optim.scheduler.*did you mean 'cosine'"):
        build_scheduler(
            _optimizer(), scheduler="cosin", max_steps=5, warmup_ratio=0, min_lr_ratio=0
        )


def test_fused_only_when_every_parameter_is_a_floating_cuda_tensor() -> None:
    import functools
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
    adamw = functools.partial(torch.optim.AdamW, lr=BASE_LR)
    assert make_optimizer(adamw, cpu).defaults["fused"] is None  # torch's default


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

    params = [torch.nn.Parameter(torch.zeros(2, device="cuda"))]
    adamw = functools.partial(torch.optim.AdamW, lr=BASE_LR)
    assert make_optimizer(adamw, params).defaults["fused"] is True
