"""Each configured value has one default: a constructor that a config section builds either
takes no default for a key of that section or exactly the declared one (frlab.config.schema),
so the Python API trains as the command line does."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
from hydra.utils import get_object

from frlab.config import schema

# declaration -> the frlab callables built from (or handed) its keys
BUILT_FROM = {
    schema.ModelConfig: ["frlab.model.policy.build_policy"],
    # for_policy(policy, **settings) hands the node's keys to the constructor
    schema.TorchEngineConfig: ["frlab.rollout.torch.engine.TorchEngine"],
    schema.TorchProcessEngineConfig: ["frlab.rollout.torch.process.ProcessTorchEngine"],
    schema.VLLMEngineConfig: ["frlab.rollout.vllm.engine.VLLMEngine.for_policy"],
    schema.RemoteEngineConfig: ["frlab.rollout.remote.engine.RemoteEngine.for_policy"],
    schema.RemoteConfig: ["frlab.rollout.remote.engine.RemoteEngine"],  # cls(**settings)
    schema.DataConfig: [
        "frlab.data.datamodule.RolloutDataModule",
        "frlab.learner.module.FlashReinforceModule",
    ],
    schema.RolloutConfig: [
        "frlab.rollout.pool.RolloutPool",
        "frlab.rollout.agent_loop.AgentLoopConfig",  # AgentLoopConfig.from_rollout
    ],
    schema.SamplingConfig: [
        "frlab.rollout.engine.SamplingParams",
        "frlab.learner.module.FlashReinforceModule",
    ],
    schema.MathEvalConfig: ["frlab.evaluation.avg_at_k.AvgAtKEvaluation"],
    schema.EpisodesEvalConfig: ["frlab.evaluation.episodes.EpisodeEvaluation"],
}
# None and a rank-0 LoRA block both mean "no adapter" (frlab.model.lora.enabled).
SAME_MEANING = {("ModelConfig", "lora")}


def declared_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default


def concrete(value: Any) -> bool:
    """A default the declaration fixes itself (not required, not following another key)."""
    if value is dataclasses.MISSING or value == "???":
        return False
    return not (isinstance(value, str) and value.startswith("${"))


def shared_defaults(cls: type, target: str) -> list[tuple[str, Any, Any]]:
    """(key, declared default, constructor default) for every key both give a default; a
    nested section the constructor does not take whole (`eval.sampling`, spread into
    temperature, top_p, ... by `from_config`) is compared key by key."""
    parameters = inspect.signature(get_object(target)).parameters
    out = []
    for f in dataclasses.fields(cls):
        value = declared_default(f)
        if f.name not in parameters and dataclasses.is_dataclass(value):
            out += [(f"{f.name}.{key}", declared, given)
                    for key, declared, given in shared_defaults(type(value), target)]  # fmt: skip
            continue
        p = parameters.get(f.name)
        if p is None or p.default is inspect.Parameter.empty:
            continue
        if dataclasses.is_dataclass(value):  # taken whole: its own BUILT_FROM row compares it
            continue
        if concrete(value):
            out.append((f.name, value, p.default))
    return out


def normal(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize(
    ("cls", "target"),
    [(cls, t) for cls, targets in BUILT_FROM.items() for t in targets],
    ids=lambda x: getattr(x, "__name__", str(x).rsplit(".", 2)[-2] if "." in str(x) else x),
)
def test_constructor_defaults_equal_the_declared_ones(cls: type, target: str) -> None:
    parameters = inspect.signature(get_object(target)).parameters
    keys = {f.name for f in dataclasses.fields(cls)}
    assert keys & set(parameters), f"{target} takes no key of {cls.__name__}: wrong pairing?"
    shared = shared_defaults(cls, target)  # empty: the constructor takes no defaults (fine)
    diff = [
        (key, declared, given)
        for key, declared, given in shared
        if normal(declared) != normal(given) and (cls.__name__, key) not in SAME_MEANING
    ]
    assert not diff, f"{target} defaults differ from {cls.__name__}: {diff}"


def test_every_declared_frlab_target_is_compared() -> None:
    """A new section whose `_target_` is frlab's must join BUILT_FROM."""
    sections = [
        obj
        for module in (schema,)
        for obj in vars(module).values()
        if dataclasses.is_dataclass(obj) and isinstance(obj, type)
    ]
    targeted = {
        cls
        for cls in sections
        if "_target_" in {f.name for f in dataclasses.fields(cls)}
        and str(
            declared_default(next(f for f in dataclasses.fields(cls) if f.name == "_target_"))
        ).startswith("frlab.")
    }
    assert targeted - set(BUILT_FROM) == set()


def test_a_drifted_default_is_caught() -> None:
    """The comparison sees a constructor default that drifted from the declaration."""

    @dataclasses.dataclass
    class Declared:
        k: int = 4

    def built(k: int = 5) -> None: ...

    import sys

    module = sys.modules[__name__]
    module._built = built  # type: ignore[attr-defined]
    assert shared_defaults(Declared, f"{__name__}._built") == [("k", 4, 5)]


def test_a_drifted_default_inside_a_spread_section_is_caught() -> None:
    """A nested section handed to the constructor key by key is compared key by key."""

    @dataclasses.dataclass
    class Inner:
        temperature: float = 0.7

    @dataclasses.dataclass
    class Outer:
        k: int = 4
        sampling: Inner = dataclasses.field(default_factory=Inner)

    def built(k: int = 4, temperature: float = 0.6) -> None: ...

    import sys

    module = sys.modules[__name__]
    module._spread = built  # type: ignore[attr-defined]
    assert shared_defaults(Outer, f"{__name__}._spread") == [
        ("k", 4, 4),
        ("sampling.temperature", 0.7, 0.6),
    ]
