"""Every `_target_` node is built by one helper: `hydra.utils.instantiate`, the keys frlab reads
itself left out, Hydra's own error named at the node's key."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from frlab.config.compose import instantiate
from frlab.config.errors import ConfigError


def test_builds_targets_with_extra_kwargs() -> None:
    import torch

    node = OmegaConf.create({"_target_": "envs.toy.ParityEnv", "num_digits": 2})
    env = instantiate(node, key="env")
    assert type(env).__name__ == "ParityEnv" and env.num_digits == 2
    params = [torch.nn.Parameter(torch.zeros(2))]
    make = instantiate({"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.5}, key="optim")
    optimizer = make(params, weight_decay=0.0)
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["lr"] == 0.5


def test_keys_frlab_reads_itself_are_not_passed_to_the_target() -> None:
    """`optim.grad_clip` (`arg=False`) is the learner's: AdamW never sees it."""
    import torch

    node = {
        "_target_": "torch.optim.AdamW",
        "_partial_": True,
        "lr": 0.5,
        "grad_clip": 1.0,
        "scheduler": "cosine",
    }
    make = instantiate(node, key="optim")
    assert set(make.keywords) == {"lr"}
    assert make([torch.nn.Parameter(torch.zeros(1))]).defaults["lr"] == 0.5


def test_a_users_own_package_is_built_without_a_flag(tmp_path, monkeypatch) -> None:
    """A config is code its user runs: any importable `_target_` is built."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "envs.py").write_text(
        "class MyEnv:\n    def __init__(self, size=1):\n        self.size = size\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    node = OmegaConf.create({"_target_": "mypkg.envs.MyEnv", "size": 3})
    assert instantiate(node, key="env").size == 3


@pytest.mark.parametrize(
    ("node", "fragment"),
    [
        ({"_target_": "envs.no_such_env_module.SomeEnv"}, "Error locating target"),
        ({"_target_": "envs.toy.ParityEnv", "num_digitz": 2}, "num_digitz"),
    ],
)
def test_hydras_error_is_named_at_the_nodes_target(node: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        instantiate(OmegaConf.create(node), key="env")
    assert info.value.key == "env._target_" and fragment in str(info.value), str(info.value)
