"""`run(cfg) -> summary`: a composed config becomes a FlashREINFORCE training run, or its plan.

As lightning-hydra-template's `train()`: preflight checks `cfg` and gives the plan's facts
(printed and returned for `dry_run=true`, recorded in summary.json otherwise); then every part
is built from `cfg` (each `_target_` through `frlab.config.compose.instantiate`), once the
`auto` budget and checkpointing are chosen for the device and written into it: the Trainer,
its logger and callbacks first, being cheap, so a bad key of theirs fails before the model
loads; the tokenizer and the policy;
the learner module; the data module, whose rollout pools drive their own engines and
environments (frlab.rollout.pool.factory). Then `fit` (resuming from `ckpt_path`) and the
summary, with plots in the run folder.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from frlab.build import build_callbacks, build_evaluation, build_trainer, plain
from frlab.config.compose import instantiate
from frlab.config.plan import components, format_plan
from frlab.config.preflight import Checked, check_config, locate_engine, structured
from frlab.errors import ConfigError

AUTO_KEYS = (("data", "max_tokens_per_micro_batch"), ("model", "gradient_checkpointing"))
__all__ = [
    "build_callbacks",
    "build_evaluation",
    "build_policy_from",
    "build_trainer",
    "plain",
    "run",
]


def run(cfg: DictConfig) -> dict[str, Any]:
    """Preflight, then the printed plan (`dry_run=true`) or the training run's summary."""
    cfg = structured(cfg)  # a config built by hand: the declared defaults it leaves out
    if not cfg.dry_run:
        from frlab.run.folder import resume_if_requeued

        resume_if_requeued(cfg)  # a job SLURM requeued resumes from its last.ckpt
    checked = check_config(cfg)
    if cfg.dry_run:
        resolve_learner(cfg, checked)  # kernels, auto budget and checkpointing, the memory plan
        print(format_plan(checked.plan), flush=True)
        return checked.plan
    return fit(cfg, checked)


def fit(cfg: DictConfig, checked: Checked) -> dict[str, Any]:
    """Build the run's parts from the checked sections, train, and return the summary."""
    import lightning as L

    from frlab.build import quiet_expected_noise
    from frlab.learner import FlashReinforceModule, LearnerSettings
    from frlab.model.tokenizer import load_tokenizer
    from frlab.plot import write_plots
    from frlab.rollout.pool.factory import env_factory, pool_factory, task_sampler_factory
    from frlab.run.guard import run_folder
    from frlab.tracking import RunFilesCallback

    quiet_expected_noise()
    plan, sections = checked.plan, checked.sections
    output_dir, guard = run_folder(cfg, plan["paths.output_dir"])
    if guard.finished:
        return guard.previous_summary  # a resume of a finished run changes nothing
    resolve_learner(cfg, checked, at_start=True)  # the `auto` values, before anything is built
    run_files = RunFilesCallback(output_dir, components=components(plan))
    trainer = build_trainer(cfg, [*build_callbacks(cfg, run_files), guard.callback], output_dir)
    L.seed_everything(int(cfg.seed), workers=True)  # after the Trainer: it draws no numbers
    tokenizer = load_tokenizer(sections["model"])  # a gguf: source is converted here, once
    make_env, make_tasks = env_factory(cfg.env), task_sampler_factory(cfg.env)
    policy = build_policy_from(sections["model"], int(cfg.seed))
    run_files.extra["plan"] = plan  # the auto values as chosen
    module = FlashReinforceModule(
        policy,
        checked.objective,
        instantiate(cfg.optim, key="optim"),
        LearnerSettings.from_sections(sections),
        record={"model": sections["model"]},
    )
    pools = pool_factory(
        sections["rollout"],
        policy,
        tokenizer,
        instantiate(cfg.rollout.engine, key="rollout.engine"),
        make_env,
        make_tasks,
        off_policy_correction=checked.objective.uses_off_policy_correction,
    )
    datamodule = instantiate(
        cfg.data,
        key="data",
        pool_factory=pools,
        seed=int(cfg.seed),
        pad_token_id=int(tokenizer.pad_token_id),
    )
    with guard.signals():  # SIGINT/SIGTERM: final checkpoint, then RunInterrupted (130/143)
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    summary = run_files.summary or run_files.finish("finished")
    if cfg.get("plots", True) and trainer.is_global_zero and run_files.rows:
        summary["plots"] = [str(p) for p in write_plots(output_dir)]
    return summary


def resolve_learner(cfg: DictConfig, checked: Checked, at_start: bool = False) -> None:
    """The plan's learner facts (frlab.model.learner_kernels): its kernels, its memory line and
    the `auto` budget and checkpointing, chosen once for the learner's device here; at the
    start of a run they are written into the sections the build uses and into `cfg`."""
    from frlab.model.auto_memory import AUTO, device_memory
    from frlab.model.learner_kernels import learner_facts

    sections = checked.sections
    engine = locate_engine(sections["rollout"])
    device = device_memory(sections["trainer"]["accelerator"])
    reserves = getattr(engine, "reserves_gpu_share", False)
    facts = learner_facts(sections, reserves, device)
    checked.plan.update(learner=facts["learner"], memory=facts["memory"])
    for section, key in AUTO_KEYS:
        value = checked.plan[f"{section}.{key}"] = facts[key]
        if not at_start:
            continue
        if value == AUTO:
            raise ConfigError(
                f"{section}.{key}", "auto needs the learner's device visible at start"
            )
        sections[section][key] = value
        OmegaConf.update(cfg, f"{section}.{key}", value, merge=False)


def build_policy_from(model: dict[str, Any], seed: int) -> Any:
    """The policy from the `model` section (its `_target_`, frlab.model.policy.build_policy by
    default); a source that cannot be loaded is a ConfigError naming `model.name_or_path`."""
    from frlab.config.schema import ModelConfig
    from frlab.model.tokenizer import source_errors

    with source_errors(model.get("name_or_path"), "model.name_or_path"):
        return instantiate({"_target_": ModelConfig._target_, **model}, key="model", seed=seed)
