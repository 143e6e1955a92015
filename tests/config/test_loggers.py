"""Loggers by group choice: the run folder's metrics.csv only by default (logger=csv: one
writer), TensorBoard, wandb (imported only when chosen)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from frlab.config.compose import compose, instantiate
from frlab.config.errors import ConfigError
from frlab.config.plan import format_plan
from frlab.config.preflight import preflight


def logger_for(choice: str, save_dir: Path, *extra: str) -> object:
    cfg = compose([f"logger={choice}", f"logger.save_dir={save_dir}", *extra], with_hydra=False)
    return instantiate(cfg.logger, key="logger")


def test_csv_is_the_default_and_adds_no_second_metrics_writer() -> None:
    """metrics.csv in the run folder is the CSV log: logger=csv builds no Lightning logger
    (Lightning's CSVLogger would write a second metrics.csv under csv/version_0)."""
    for overrides in ([], ["logger=csv"]):
        cfg = compose(overrides)
        assert cfg.logger is None and preflight(cfg)["logger._target_"] is None
    assert "metrics.csv" in format_plan(preflight(compose([])))


def test_tensorboard(tmp_path: Path) -> None:
    logger = logger_for("tensorboard", tmp_path)
    assert type(logger).__name__ == "TensorBoardLogger"


def test_wandb_composes_without_importing_wandb() -> None:
    plan = preflight(compose(["logger=wandb", "logger.offline=true"]))
    assert plan["logger._target_"] == "lightning.pytorch.loggers.WandbLogger"
    assert "wandb" not in sys.modules


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_without_the_extra_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        logger_for("wandb", tmp_path, "logger.name=x", "logger.offline=true")
    assert info.value.key == "logger._target_"
    assert "wandb" in str(info.value)


def test_an_unresolvable_node_names_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        logger_for("wandb", tmp_path)  # name: ${hydra:...} outside a Hydra run
    assert info.value.key == "logger"


def test_no_logger() -> None:
    assert preflight(compose(["~logger"]))["logger._target_"] is None
