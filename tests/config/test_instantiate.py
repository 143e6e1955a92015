"""All instantiation goes through one allowlisted helper with clear errors."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from frlab.config.errors import ConfigError
from frlab.config.instantiate import (
    ALLOWED_TARGETS,
    BUILTIN_PREFIXES,
    accepted_arguments,
    check_allowed,
    check_user_modules,
    instantiate,
    iter_targets,
)


def test_the_allowlist_names_third_party_classes_exactly() -> None:
    assert BUILTIN_PREFIXES == ("frlab.", "envs.")
    assert "torch.optim.AdamW" in ALLOWED_TARGETS and "lightning.Trainer" in ALLOWED_TARGETS
    assert not any(t.startswith("torch.hub") for t in ALLOWED_TARGETS)


def test_builds_allowed_targets_with_extra_kwargs() -> None:
    import torch

    node = OmegaConf.create({"_target_": "envs.toy.ParityEnv", "num_digits": 2})
    env = instantiate(node, key="env")
    assert type(env).__name__ == "ParityEnv" and env.num_digits == 2
    params = [torch.nn.Parameter(torch.zeros(2))]
    make = instantiate({"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.5}, key="optim")
    optimizer = make(params, weight_decay=0.0)
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["lr"] == 0.5


@pytest.mark.parametrize(
    "target", ["torch.hub.load", "torch.load", "torch.nn.Linear", "lightning.fabric.Fabric",
               "os.system", "builtins.eval", "frlabx.Foo", "subprocess.run", "pickle.loads"]
)  # fmt: skip
def test_arbitrary_callables_are_refused(target: str) -> None:
    with pytest.raises(ConfigError, match="not allowed"):
        check_allowed(OmegaConf.create({"_target_": target}), "env")


def test_user_modules_admit_the_users_own_package(tmp_path, monkeypatch) -> None:
    """`user_modules=[mypkg]` admits mypkg.envs.MyEnv, not the standard library or torch."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "envs.py").write_text(
        "class MyEnv:\n    def __init__(self, size=1):\n        self.size = size\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    node = OmegaConf.create({"_target_": "mypkg.envs.MyEnv", "size": 3})
    with pytest.raises(ConfigError, match="user_modules"):
        instantiate(node, key="env")
    assert instantiate(node, key="env", user_modules=["mypkg"]).size == 3
    assert check_user_modules(["mypkg", "mypkg.sub"]) == ("mypkg.", "mypkg.sub.")
    for bad in ("os", "subprocess", "torch", "transformers", "builtins", "my-pkg", ""):
        with pytest.raises(ConfigError) as info:
            check_user_modules([bad])
        assert info.value.key == "user_modules[0]"


def test_nested_targets_are_checked_before_anything_is_built() -> None:
    node = OmegaConf.create(
        {"_target_": "frlab.tracking.ProgressBar", "_args_": [{"_target_": "os.getcwd"}]}
    )
    keys = [k for k, _ in iter_targets(node, "m")]
    assert keys == ["m._target_", "m._args_[0]._target_"]
    with pytest.raises(
        ConfigError, match=r"`m\._args_\[0\]\._target_`.*'os\.getcwd' is not allowed"
    ):
        instantiate(node, key="m")


def test_missing_module_reads_as_not_implemented() -> None:
    node = OmegaConf.create({"_target_": "envs.no_such_env_module.SomeEnv"})
    with pytest.raises(ConfigError) as info:
        instantiate(node, key="env")
    assert info.value.key == "env._target_"
    assert "not yet implemented" in str(info.value)


def test_bad_kwargs_name_the_key() -> None:
    node = OmegaConf.create({"_target_": "envs.toy.ParityEnv", "num_digitz": 2})
    with pytest.raises(ConfigError, match="did you mean 'num_digits'") as info:
        instantiate(node, key="env")
    assert info.value.key == "env.num_digitz"


def test_a_bad_kwarg_handed_on_to_a_base_class_is_named_with_the_bases_arguments() -> None:
    """frlab's ProgressBar takes **kwargs for Lightning's TQDMProgressBar: the names offered
    are the base class's."""
    node = OmegaConf.create({"_target_": "frlab.tracking.ProgressBar", "refresh_rat": 3})
    with pytest.raises(ConfigError, match="did you mean 'refresh_rate'") as info:
        instantiate(node, key="callbacks.progress_bar")
    assert info.value.key == "callbacks.progress_bar.refresh_rat"
    assert accepted_arguments("frlab.tracking.ProgressBar") == [
        "leave", "process_position", "refresh_rate"
    ]  # fmt: skip


def test_a_bad_kwarg_of_a_nested_node_or_raised_inside_is_not_pinned_on_the_outer_key(
    tmp_path, monkeypatch
) -> None:
    """Only a key of the node itself that its target does not take is named as the node's:
    a nested node's typo, or a TypeError from inside a constructor, keeps the target's error."""
    (tmp_path / "nestpkg").mkdir()
    (tmp_path / "nestpkg" / "__init__.py").write_text(
        "class Inner:\n    def __init__(self, size=1):\n        self.size = size\n"
        "class Outer:\n    def __init__(self, inner=None, depth=1):\n        self.inner = inner\n"
        "def helper(size):\n    return size\n"
        "class Calls:\n    def __init__(self, depth=1):\n        helper(depth=depth)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    nested = {"_target_": "nestpkg.Outer", "inner": {"_target_": "nestpkg.Inner", "sise": 2}}
    inside = {"_target_": "nestpkg.Calls", "depth": 2}
    for node in (nested, inside):
        with pytest.raises(ConfigError) as info:
            instantiate(OmegaConf.create(node), key="env", user_modules=["nestpkg"])
        assert info.value.key == "env._target_", str(info.value)
    own = {"_target_": "nestpkg.Outer", "dept": 2}
    with pytest.raises(ConfigError, match="did you mean 'depth'") as info:
        instantiate(OmegaConf.create(own), key="env", user_modules=["nestpkg"])
    assert info.value.key == "env.dept"
