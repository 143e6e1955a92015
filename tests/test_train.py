"""`frlab.train.run` wires every piece from its config node: one objective per run, the
optimizer from `optim` (a partial of torch.optim.AdamW), the data module from `data`."""

from __future__ import annotations

from pathlib import Path

import pytest

from frlab.config.compose import compose


def test_a_run_builds_the_objective_once_and_every_node_from_its_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from frlab import train
    from frlab.objective import Objective

    built: list[Objective] = []
    init = Objective.__init__

    def counting_init(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        built.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(Objective, "__init__", counting_init)
    import lightning as L

    seen: dict[str, object] = {}

    class Recorder(L.Callback):
        def on_train_end(self, trainer, pl_module) -> None:  # noqa: ANN001
            seen.update(
                module=pl_module, optimizer=trainer.optimizers[0], datamodule=trainer.datamodule
            )

    callbacks = train.build_callbacks
    monkeypatch.setattr(train, "build_callbacks", lambda *a: [*callbacks(*a), Recorder()])
    cfg = compose(
        [
            f"paths.output_dir={tmp_path}",
            "trainer.max_steps=2",
            "data.batch_size=4",
            "data.micro_batch_size=2",
            "rollout.max_in_flight=4",
            "plots=false",
            "optim.lr=0.01",
            "optim.betas=[0.5,0.75]",
            "~callbacks.model_checkpoint",
            "trainer.enable_checkpointing=false",
        ]
    )
    summary = train.run(cfg)
    assert summary["steps"] == 2
    # preflight builds the run's one Objective; the learner trains with that object
    assert len(built) == 1 and seen["module"].objective is built[0]
    learner = built[0]
    assert learner.names == {kind: cfg.objective[kind] for kind in learner.names}
    optimizer = seen["optimizer"]
    assert type(optimizer) is torch.optim.AdamW
    assert (optimizer.defaults["lr"], tuple(optimizer.defaults["betas"])) == (0.01, (0.5, 0.75))
    assert type(seen["datamodule"]).__name__ == "RolloutDataModule"


def test_the_optimizer_and_data_module_come_from_their_nodes() -> None:
    import torch

    from frlab.config.compose import instantiate
    from frlab.data.datamodule import RolloutDataModule

    cfg = compose(
        ["optim.lr=0.01", "optim.betas=[0.5,0.75]", "optim.weight_decay=0.2", "data.batch_size=8"]
    )
    make = instantiate(cfg.optim, key="optim")
    optimizer = make([torch.nn.Parameter(torch.zeros(3))])
    assert type(optimizer) is torch.optim.AdamW
    group = optimizer.param_groups[0]
    assert (group["lr"], tuple(group["betas"]), group["weight_decay"], group["eps"]) == (
        0.01,
        (0.5, 0.75),
        0.2,
        1e-8,
    )
    assert "grad_clip" not in group and "scheduler" not in group  # read by the learner
    data = instantiate(cfg.data, key="data", pool_factory=lambda **kw: None, seed=3)
    assert isinstance(data, RolloutDataModule) and (data.batch_size, data.seed) == (8, 3)


def test_a_bad_callback_key_fails_before_the_model_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Trainer, its logger and callbacks are built first: a misspelt callback argument
    is refused, naming the key, before minutes of model loading on a GPU."""
    from frlab import train
    from frlab.config.errors import ConfigError

    def no_model(*args: object) -> None:
        raise AssertionError("the policy was built before the callbacks were checked")

    monkeypatch.setattr(train, "build_policy_from", no_model)
    cfg = compose([f"paths.output_dir={tmp_path}", "+callbacks.progress_bar.refresh_rat=3"])
    with pytest.raises(ConfigError, match="unexpected keyword argument 'refresh_rat'") as info:
        train.run(cfg)
    assert info.value.key == "callbacks.progress_bar._target_"
