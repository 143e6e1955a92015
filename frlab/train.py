"""`run(cfg) -> summary`: a composed config becomes a FlashREINFORCE training run, or its plan.

As lightning-hydra-template's `train()`: preflight checks `cfg` and gives the plan's facts
(printed and returned for `dry_run=true`, recorded in summary.json otherwise); then every part
is built from `cfg` (each `_target_` through `frlab.config.compose.instantiate`): the Trainer,
its logger and callbacks first, being cheap, so a bad key of theirs fails before the model
loads; the tokenizer and the policy (`auto` budget and checkpointing chosen for the device);
the learner module; the data module, whose rollout pools drive their own engines and
environments (frlab.rollout.pool.factory). Then `fit` (resuming from `ckpt_path`) and the
summary, with plots in the run folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf

from frlab.build import arguments, build_callbacks, build_evaluation, build_trainer, plain
from frlab.config.compose import instantiate
from frlab.config.errors import ConfigError, keyed
from frlab.config.plan import format_plan
from frlab.config.preflight import locate_engine, preflight, structured

LEARNER_SECTIONS = ("model", "data", "rollout", "trainer")  # what the learner's facts read
__all__ = ["build_callbacks", "build_evaluation", "build_policy_from", "build_trainer", "plain",
           "run"]  # fmt: skip


def run(cfg: DictConfig) -> dict[str, Any]:
    """Preflight, then the printed plan (`dry_run=true`) or the training run's summary."""
    cfg = structured(cfg)  # a config built by hand: the declared defaults it leaves out
    if not cfg.dry_run:
        from frlab.run.folder import resume_if_requeued

        resume_if_requeued(cfg)  # a job SLURM requeued resumes from its last.ckpt
    plan = preflight(cfg)
    if cfg.dry_run:
        learner_plan(cfg, plan)  # kernels, auto budget and checkpointing, the memory plan
        print(format_plan(plan), flush=True)
        return plan
    return fit(cfg, plan)


def fit(cfg: DictConfig, plan: dict[str, Any]) -> dict[str, Any]:
    """Build the run's parts from `cfg`, train, and return the summary (`plan`: recorded)."""
    import lightning as L

    from frlab.build import quiet_expected_noise
    from frlab.learner import FlashReinforceModule
    from frlab.model.tokenizer import load_tokenizer
    from frlab.plot import write_plots
    from frlab.rollout.pool.factory import env_factory, pool_factory, task_sampler_factory
    from frlab.run.guard import run_folder
    from frlab.tracking import RunFilesCallback

    quiet_expected_noise()
    output_dir, guard = run_folder(cfg, plan["output_dir"])
    if guard.finished:
        return guard.previous_summary  # a resume of a finished run changes nothing
    run_files = RunFilesCallback(output_dir, components=plan["components"])
    trainer = build_trainer(cfg, [*build_callbacks(cfg, run_files), guard.callback], output_dir)
    L.seed_everything(int(cfg.seed), workers=True)  # after the Trainer: it draws no numbers
    model, data, rollout = plain(cfg.model), plain(cfg.data), plain(cfg.rollout)
    with config_errors():
        tokenizer = load_tokenizer(model)
        make_env, make_tasks = env_factory(cfg.env), task_sampler_factory(cfg.env)
    policy = learner_policy(cfg, plan, model, data)
    run_files.extra["plan"] = plan  # the auto values as chosen
    module = FlashReinforceModule(
        arguments(model), plain(cfg.objective), arguments(plain(cfg.optim)), policy=policy,
        batch_size=data["batch_size"], micro_batch_size=data["micro_batch_size"],
        max_tokens_per_micro_batch=data["max_tokens_per_micro_batch"],
        pack_sequences=data["pack_sequences"], temperature=rollout["sampling"]["temperature"],
        max_steps=cfg.trainer.max_steps, optimizer=instantiate(cfg.optim, key="optim"),
    )  # fmt: skip
    pools = pool_factory(
        rollout, policy, tokenizer, instantiate(cfg.rollout.engine, key="rollout.engine"),
        make_env, checked(make_tasks),
        off_policy_correction=module.objective.uses_off_policy_correction,
    )  # fmt: skip
    datamodule = instantiate(cfg.data, key="data", pool_factory=pools, seed=int(cfg.seed),
                             pad_token_id=int(tokenizer.pad_token_id))  # fmt: skip
    with guard.signals():  # SIGINT/SIGTERM: final checkpoint, then RunInterrupted (130/143)
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    summary = run_files.summary or run_files.finish("finished")
    if cfg.get("plots", True) and trainer.is_global_zero and run_files.rows:
        summary["plots"] = [str(p) for p in write_plots(output_dir)]
    return summary


def learner_policy(
    cfg: DictConfig, plan: dict[str, Any], model: dict[str, Any], data: dict[str, Any]
) -> Any:
    """The policy, with `auto` budget and checkpointing chosen once its config is known
    (recorded in `plan`, written into `model` and `data`)."""
    from frlab.model.auto_memory import AUTO
    from frlab.model.lora import base_of
    from frlab.model.policy import checkpoint_policy

    auto = model.get("gradient_checkpointing") == AUTO
    policy = build_policy_from({**model, "gradient_checkpointing": False} if auto else model,
                               int(cfg.seed))  # fmt: skip
    learner_plan(cfg, plan, base_of(policy).config)
    for key, node in (("max_tokens_per_micro_batch", data), ("gradient_checkpointing", model)):
        if plan[key] == AUTO:
            section = "data" if node is data else "model"
            raise ConfigError(
                f"{section}.{key}", "auto needs the learner's device visible at start"
            )
        node[key] = plan[key]
    if auto and plan["gradient_checkpointing"]:
        checkpoint_policy(policy)
    return policy


def learner_plan(cfg: DictConfig, plan: dict[str, Any], config: Any = None) -> None:
    """The plan's learner facts (frlab.model.learner_kernels): its kernels, its memory line,
    and the `auto` budget and checkpointing chosen for the learner's device here (`config`: the
    model's transformers config, once loaded)."""
    from frlab.model.auto_memory import device_memory
    from frlab.model.learner_kernels import learner_facts

    sections = {k: OmegaConf.to_container(cfg[k], resolve=True) for k in LEARNER_SECTIONS}
    engine = locate_engine(sections["rollout"])  # type: ignore[arg-type]
    plan.update(learner_facts(sections, getattr(engine, "reserves_gpu_share", False),
                              device_memory(sections["trainer"]["accelerator"]), config))  # type: ignore[index]  # fmt: skip


def build_policy_from(model: dict[str, Any], seed: int) -> Any:
    """The policy from the `model` node (its `_target_`, frlab.model.policy.build_policy by
    default); a source that cannot be loaded is a ConfigError naming `model.name_or_path`."""
    from frlab.config.schema import ModelConfig
    from frlab.model.tokenizer import source_errors

    with config_errors(), source_errors(model.get("name_or_path"), "model.name_or_path"):
        return instantiate({"_target_": ModelConfig._target_, **model}, key="model", seed=seed)


@contextlib.contextmanager
def config_errors() -> Iterator[None]:
    """ValueErrors whose text starts with the config key (as frlab's packages raise them) as
    ConfigErrors."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as exc:
        raise keyed(exc) from exc


def checked(make: Callable[[], Any]) -> Callable[[], Any]:
    """`make` with `config_errors` around each call (a factory the data module calls later)."""

    def call() -> Any:
        with config_errors():
            return make()

    return call
