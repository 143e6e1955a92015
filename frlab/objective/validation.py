"""Input validation for the objective, nearly free on the hot path.

Every error is a `ValueError` that names the offending argument. Refused: non-2D or empty
log_probs; mismatched shapes; a non-bool mask; non-float log-probs; inputs on different
devices; a row with no policy token; non-finite rewards or advantages; policy-token log-probs
that are non-finite or > 0; filtering without entropies and failures (or with wrong shapes,
dtypes, devices, non-finite policy-token entropies). Structural checks (rank, shape, dtype,
device) read only tensor metadata. Value checks are each reduced on device to one 0-d flag;
the flags are stacked and read back with a single host sync, and the detailed message
(counts, first offending position) is built only when a flag is set (see `ValueChecks` for
the cheap token screen). Hyperparameters are checked once, when a component is constructed,
against their declarations (`frlab.objective.hyperparameters`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

# --------------------------------------------------------------------------- counts


def check_count(value: object, name: str) -> int:
    """A positive integer (python or numpy int, never bool)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    try:
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from None
    if out <= 0:
        raise ValueError(f"{name} must be a positive integer, got {out}")
    return out


# --------------------------------------------------------------------------- structure


def _is_tensor(x: object, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_token_tensors(log_probs: Tensor, behavior_log_probs: Tensor, action_mask: Tensor) -> None:
    """log_probs [B,T] float, non-empty; behaviour log-probs and bool mask of the same shape."""
    _is_tensor(log_probs, "log_probs")
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs must be 2-D [B, T], got shape {list(log_probs.shape)}")
    if log_probs.numel() == 0:
        raise ValueError(f"log_probs must be non-empty, got shape {list(log_probs.shape)}")
    for name, x in (("log_probs", log_probs), ("behavior_log_probs", behavior_log_probs)):
        _is_tensor(x, name)
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    check_same(behavior_log_probs, "behavior_log_probs", log_probs)
    _is_tensor(action_mask, "action_mask")
    check_same(action_mask, "action_mask", log_probs)
    if action_mask.dtype != torch.bool:
        raise ValueError(f"action_mask must be a bool tensor, got {action_mask.dtype}")


def check_same(x: Tensor, name: str, like: Tensor) -> None:
    """`x` has the shape and device of `like` (log_probs)."""
    if x.shape != like.shape:
        raise ValueError(
            f"{name} must have the shape of log_probs {list(like.shape)}, got {list(x.shape)}"
        )
    check_device(x, name, like)


def check_device(x: Tensor, name: str, like: Tensor) -> None:
    if x.device != like.device:
        raise ValueError(f"{name} is on {x.device}, log_probs on {like.device}: same device needed")


def check_row_tensor(x: object, name: str, like: Tensor, *, kind: str) -> Tensor:
    """A per-row vector [B] on log_probs' device; kind: 'float', 'real', 'bool' or 'int'."""
    x = _is_tensor(x, name)
    b = like.shape[0]
    if x.dim() != 1 or x.shape[0] != b:
        raise ValueError(f"{name} must have shape [{b}] (one per row), got {list(x.shape)}")
    check_device(x, name, like)
    ok = {
        "float": x.is_floating_point(),
        "real": not (x.is_complex() or x.dtype == torch.bool),
        "bool": x.dtype == torch.bool,
        "int": not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool),
    }[kind]
    if not ok:
        raise ValueError(f"{name} must be a {kind} tensor, got {x.dtype}")
    return x


def check_filter_inputs(
    entropies: Tensor | None, failures: Tensor | None, like: Tensor, who: str
) -> None:
    """Entropies [B,T] float and failures [B] bool, both required by an entropy token filter."""
    if entropies is None or failures is None:
        missing = [n for n, v in (("entropies", entropies), ("failures", failures)) if v is None]
        raise ValueError(
            f"{who} needs entropies [B, T] and failures [B]; missing: {', '.join(missing)}"
        )
    _is_tensor(entropies, "entropies")
    if not entropies.is_floating_point():
        raise ValueError(f"entropies must be a floating-point tensor, got {entropies.dtype}")
    check_same(entropies, "entropies", like)
    check_row_tensor(failures, "failures", like, kind="bool")


def check_loss_structure(
    log_probs: Tensor,
    behavior_log_probs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    entropies: Tensor | None,
    failures: Tensor | None,
    filter_name: str | None,
    num_sequences: int | None,
    num_tokens: int | Tensor | None,
) -> None:
    """Metadata-only checks of one objective call (no host sync).

    `filter_name` is the token filter that needs entropies and failures, None when none does.
    """
    check_token_tensors(log_probs, behavior_log_probs, action_mask)
    check_row_tensor(advantages, "advantages", log_probs, kind="float")
    if filter_name is not None:
        check_filter_inputs(entropies, failures, log_probs, f"token_filter {filter_name!r}")
    if num_sequences is not None:
        n = check_count(num_sequences, "num_sequences")
        if n < log_probs.shape[0]:
            raise ValueError(
                f"num_sequences ({n}) is the global batch size and cannot be smaller than "
                f"this batch's {log_probs.shape[0]} rows"
            )
    if num_tokens is not None and not isinstance(num_tokens, Tensor):
        check_count(num_tokens, "num_tokens")


def check_rewards(rewards: object, name: str = "rewards") -> Tensor:
    """Rewards [B]: 1-D, non-empty, real and finite (one host sync)."""
    rewards = _is_tensor(rewards, name)
    if rewards.dim() != 1 or rewards.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D tensor [B], got {list(rewards.shape)}")
    if rewards.is_complex() or rewards.dtype == torch.bool:
        raise ValueError(f"{name} must be a real tensor, got {rewards.dtype}")
    if rewards.is_floating_point() and not bool(torch.isfinite(rewards).all()):
        raise ValueError(_nonfinite_rows(rewards, name))
    return rewards


# --------------------------------------------------------------------------- values (one sync)


def _nonfinite_rows(x: Tensor, name: str) -> str:
    bad = (~torch.isfinite(x)).nonzero().flatten()
    first = int(bad[0])
    return (
        f"{name} must be finite; {bad.numel()} non-finite value(s), first "
        f"{name}[{first}]={x[first].item()}"
    )


def _bad_tokens(x: Tensor, bad: Tensor, name: str, rule: str) -> str:
    where = bad.nonzero()
    i, t = (int(v) for v in where[0])
    return (
        f"{name} must be {rule} on policy tokens (action_mask True); {where.shape[0]} bad "
        f"value(s), first {name}[{i}, {t}]={x[i, t].item()}"
    )


def _log_prob_flag(values: Tensor) -> Tensor:
    """True unless every value is finite and <= 0 (NaN fails both comparisons)."""
    lo, hi = torch.aminmax(values)
    return ~((hi <= 0) & (lo > -math.inf))


def _finite_flag(values: Tensor) -> Tensor:
    lo, hi = torch.aminmax(values)
    return ~((hi < math.inf) & (lo > -math.inf))


class ValueChecks:
    """Collects 0-d bool flags and raises the first failing check after ONE host sync.

    Token checks screen `x * mask` (one multiply and one `aminmax`, far cheaper than a
    `torch.where` on CPU). That product is used for nothing but this screen: NaN/inf in a
    masked slot make it a false alarm, which an exact re-check (`where` + `aminmax`, one more
    sync) clears; only a real offender raises. The loss itself never multiplies by the mask.
    """

    def __init__(self, mask: Tensor, dtype: torch.dtype) -> None:
        self.mask = mask
        self._mask_float: Tensor | None = None
        self._dtype = dtype
        self._flags: list[Tensor] = []
        self._messages: list[Callable[[], str]] = []
        self._exact: list[Callable[[], bool] | None] = []

    def add(
        self, flag: Tensor, message: Callable[[], str], exact: Callable[[], bool] | None = None
    ) -> None:
        """`exact()` (if given) re-checks a set flag precisely; False means a false alarm."""
        self._flags.append(flag.reshape(()))
        self._messages.append(message)
        self._exact.append(exact)

    def _screen(self, x: Tensor) -> Tensor:
        if self._mask_float is None:
            self._mask_float = self.mask.to(self._dtype)
        return x.detach() * self._mask_float

    def empty_rows(self, policy_tokens: Tensor) -> None:
        def msg() -> str:
            rows = (policy_tokens == 0).nonzero().flatten().tolist()
            return f"action_mask has no policy token in row(s) {rows[:10]}: every row needs one"

        self.add((policy_tokens == 0).any(), msg)

    def finite_rows(self, x: Tensor, name: str) -> None:
        self.add(~torch.isfinite(x).all(), lambda: _nonfinite_rows(x, name))

    def log_probs(self, x: Tensor, name: str) -> None:
        """Policy-token values of `x` must be finite and <= 0."""
        x = x.detach()

        def exact() -> bool:
            return bool(_log_prob_flag(torch.where(self.mask, x, 0.0)))

        def msg() -> str:
            bad = self.mask & ~((x <= 0) & (x > -math.inf))
            return _bad_tokens(x, bad, name, "finite and <= 0")

        self.add(_log_prob_flag(self._screen(x)), msg, exact)

    def entropies(self, x: Tensor) -> None:
        """Policy-token entropies must be finite."""
        x = x.detach()

        def exact() -> bool:
            return bool(_finite_flag(torch.where(self.mask, x, 0.0)))

        def msg() -> str:
            return _bad_tokens(x, self.mask & ~torch.isfinite(x), "entropies", "finite")

        self.add(_finite_flag(self._screen(x)), msg, exact)

    def token_count(self, policy_tokens: Tensor, num_tokens: int | Tensor) -> None:
        local = policy_tokens.sum()

        def msg() -> str:
            return (
                f"num_tokens ({int(num_tokens)}) is smaller than this batch's {int(local)} policy "
                "tokens"
            )

        self.add(local > num_tokens, msg)

    def raise_first(self) -> None:
        """One host sync for all flags; the message of the first set flag is built lazily."""
        if not self._flags:
            return
        flags = torch.stack(self._flags).tolist()
        for flag, message, exact in zip(flags, self._messages, self._exact, strict=True):
            if flag and (exact is None or exact()):
                raise ValueError(message())


# --------------------------------------------------------------------------- component outputs


def check_trust_region_output(out: Any, batch: Any, component: Any) -> None:
    """A trust region kept its return contract (metadata only, no host sync)."""
    who = f"trust region {component.name!r}"
    b, shape = batch.action_mask.shape[0], tuple(batch.action_mask.shape)
    if not isinstance(out.weights, Tensor) or tuple(out.weights.shape) != shape:
        raise ValueError(f"{who} returned weights that are not a [B, T] = {list(shape)} tensor")
    if out.weights.requires_grad:
        raise ValueError(f"{who} returned weights that require grad: detach them")
    admitted = out.admitted
    if not isinstance(admitted, Tensor) or admitted.dtype != torch.bool or admitted.shape != (b,):
        raise ValueError(f"{who} must return `admitted` as a bool [B] = [{b}] tensor")
    declared = {d.name: d for d in component.diagnostics}
    if set(out.diagnostics) != set(declared):
        raise ValueError(
            f"{who} returned diagnostics {sorted(out.diagnostics)} but declares "
            f"{sorted(declared)}: every returned statistic must be declared in its "
            "`diagnostics` (so it is logged), and every declared one returned"
        )
    for name, value in out.diagnostics.items():
        want = (b,) if declared[name].per == "row" else ()
        if not isinstance(value, Tensor) or tuple(value.shape) != want:
            got = list(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(
                f"{who}: diagnostic {name!r} (per={declared[name].per}) must have shape "
                f"{list(want)}, got {got}"
            )
