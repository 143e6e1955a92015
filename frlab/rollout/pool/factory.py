"""How a run's rollout pools are built from its config nodes: per learner rank one pool, with
its own engine and task sampler, and a fresh environment for every episode.

- `env_factory(node)`: fresh environments from the `env` node (one is built at once, so a
  missing class or a bad argument fails before training starts);
- `task_sampler_factory(node)`: task samplers from the same node, the class's `task_sampler`
  classmethod (no episode opened) or one instance's `sample_task` (envs.base.EnvTaskSampler);
- `pool_factory(...)`: the data module's per-rank pool builder.

A node that cannot be built is a ValueError whose text starts with the config key (`env` or
`env._target_`, Hydra's own words after it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from frlab.errors import ConfigError


def _values(node: Any) -> dict[str, Any]:
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    return dict(node)


def _build(node: Any, **kwargs: Any) -> Any:
    """`hydra.utils.instantiate` of the env node; its failure named at `env._target_`."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(OmegaConf.create(_values(node)), _convert_="all", **kwargs)
    except InstantiationException as exc:
        raise ConfigError("env._target_", f"{' '.join(str(exc).split())}") from exc


def env_factory(node: Any) -> Callable[[], Any]:
    """A zero-argument factory of fresh environments (one per episode) from an env node. A flat
    node (one `_target_`, no other Hydra keys) becomes a plain `functools.partial`: cheap and
    thread-safe."""
    from hydra.utils import get_object

    first = _build(node)
    close = getattr(first, "close", None)
    if callable(close):
        close()
    kwargs = _values(node)
    flat = not any(
        str(k).startswith("_") and k != "_target_" or _targets(v) for k, v in kwargs.items()
    )
    if flat:
        return functools.partial(get_object(kwargs.pop("_target_")), **kwargs)
    return functools.partial(_build, kwargs)


def _targets(value: Any) -> bool:
    """Whether a value holds a nested `_target_` node."""
    if isinstance(value, Mapping):
        return "_target_" in value or any(_targets(v) for v in value.values())
    return isinstance(value, list | tuple) and any(_targets(v) for v in value)


def task_sampler_factory(node: Any) -> Callable[[], Any]:
    """A zero-argument factory of task samplers (envs.base.TaskSampler, one per rollout pool)
    from an env node: `env._target_`'s classmethod `task_sampler(**kwargs)`, which opens no
    episode; a target without one (a function that returns an env) samples from one instance
    it builds (`envs.base.EnvTaskSampler`)."""

    def make() -> Any:
        from envs.base import EnvTaskSampler

        built = _build(node, _partial_=True)
        target, args, kwargs = built.func, built.args, built.keywords
        try:
            if callable(getattr(target, "task_sampler", None)):
                return target.task_sampler(*args, **kwargs)
            return EnvTaskSampler(target(*args, **kwargs))
        except (TypeError, ValueError, OSError) as exc:  # bad or missing env arguments
            raise ValueError(f"env cannot build its task sampler: {exc}") from exc

    return make


def pool_factory(
    rollout: Mapping[str, Any],
    policy: Any,
    tokenizer: Any,
    make_engine: Callable[..., Any],
    make_env: Callable[[], Any],
    make_tasks: Callable[[], Any],
    *,
    off_policy_correction: bool,
) -> Callable[..., Any]:
    """A factory of RolloutPools, each with its own engine (`make_engine(policy=, seed=)`, the
    `rollout.engine` partial) and task sampler, the resolved `rollout` node's settings; the data
    module calls it per rank with `batch_size`, `seed`, `prompt_id_offset`, `prompt_id_stride`.
    `off_policy_correction` is the objective's: the pool refuses truncated sampling then."""
    from frlab.rollout.agent_loop import AgentLoopConfig
    from frlab.rollout.pool.pool import RolloutPool

    loop_cfg = AgentLoopConfig.from_rollout(rollout)  # limits, sampling, deadlines

    def make(*, batch_size: int, seed: int, **shard: Any) -> Any:
        """One rank's pool: `batch_size` = B / W rows per step, its own seed and prompt ids."""
        return RolloutPool(
            make_engine(policy=policy, seed=seed),
            make_env,
            tokenizer,
            loop_cfg,
            task_sampler=make_tasks(),
            batch_size=batch_size,
            max_in_flight=rollout["max_in_flight"],
            max_policy_lag=rollout["max_policy_lag"],
            mode=rollout["mode"],
            samples_per_prompt=rollout["samples_per_prompt"],
            seed=seed,
            max_prompt_retries=rollout["max_prompt_retries"],
            off_policy_correction=off_policy_correction,
            **shard,
        )

    return make
