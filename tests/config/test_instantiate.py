"""All instantiation goes through one allowlisted helper with clear errors."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from frlab.config.errors import ConfigError
from frlab.config.instantiate import ALLOWED_PREFIXES, check_allowed, instantiate, iter_targets


def test_allowlist_prefixes() -> None:
    assert ALLOWED_PREFIXES == ("frlab.", "envs.", "lightning.", "torch.")


def test_builds_allowed_targets_with_extra_kwargs() -> None:
    node = OmegaConf.create({"_target_": "envs.toy.ParityEnv", "num_digits": 2})
    env = instantiate(node, key="env")
    assert type(env).__name__ == "ParityEnv" and env.num_digits == 2
    layer = instantiate({"_target_": "torch.nn.Linear", "in_features": 3}, key="x", out_features=5)
    assert tuple(layer.weight.shape) == (5, 3)


def test_nested_targets_are_checked_before_anything_is_built() -> None:
    node = OmegaConf.create(
        {"_target_": "torch.nn.Sequential", "_args_": [{"_target_": "os.getcwd"}]}
    )
    keys = [k for k, _ in iter_targets(node, "m")]
    assert keys == ["m._target_", "m._args_[0]._target_"]
    with pytest.raises(
        ConfigError, match=r"`m\._args_\[0\]\._target_`.*'os\.getcwd' is not allowed"
    ):
        instantiate(node, key="m")


@pytest.mark.parametrize("target", ["os.system", "builtins.eval", "frlabx.Foo", "subprocess.run"])
def test_targets_outside_the_allowlist_raise(target: str) -> None:
    with pytest.raises(ConfigError, match="not allowed"):
        check_allowed(OmegaConf.create({"_target_": target}), "env")


def test_missing_module_reads_as_not_implemented() -> None:
    node = OmegaConf.create({"_target_": "envs.no_such_env_module.SomeEnv"})
    with pytest.raises(ConfigError) as info:
        instantiate(node, key="env")
    assert info.value.key == "env._target_"
    assert "not yet implemented" in str(info.value)


def test_bad_kwargs_name_the_key() -> None:
    node = OmegaConf.create({"_target_": "envs.toy.ParityEnv", "num_digitz": 2})
    with pytest.raises(ConfigError, match=r"(?s)env\._target_.*num_digitz"):
        instantiate(node, key="env")
