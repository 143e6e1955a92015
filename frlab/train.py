"""`run(cfg) -> summary`: a composed config becomes a FlashREINFORCE training run.

The story (the FlashREINFORCE paper's one-pass update): validate the config (preflight: the plan and the
objective, built once); build the callbacks (weight sync every `rollout.sync_every` steps,
evaluation, run files, progress bar, atomic checkpoints), the logger and the Trainer, which
are cheap, so a bad key of theirs fails before the model loads; then the policy and its
tokenizer, the learner module (policy, objective, optimizer), the rollout side (a data module
whose pool drives its own engine copy of the weights and one environment per episode); then
`fit` (resuming from `ckpt_path`) and the summary (also in `summary.json`), with plots in the
run folder. Each object with a `_target_` is built by
`frlab.config.instantiate.instantiate` (frlab.build).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from frlab.build import (
    arguments,
    build_callbacks,
    build_evaluation,
    build_policy_from,
    build_tokenizer,
    build_trainer,
    check_vocab,
    env_factory,
    load_tokenizer,
    plain,
    pool_factory,
    quiet_expected_noise,
    user_modules,
    write_plots,
)
from frlab.config.errors import ConfigError
from frlab.config.instantiate import instantiate
from frlab.config.plan import Plan, learner_plan
from frlab.run.guard import check_resume, run_folder

__all__ = ["build_callbacks", "build_evaluation", "build_policy_from", "build_tokenizer",
           "build_trainer", "check_resume", "check_vocab", "env_factory", "plain", "run"]  # fmt: skip


def learner_policy(cfg: DictConfig, plan: Plan, model: dict[str, Any]) -> Any:
    """The policy, with `auto` budget and checkpointing chosen once its config is known
    (written into `plan` and `model`)."""
    from frlab.model.auto_memory import AUTO
    from frlab.model.lora import base_of
    from frlab.model.policy import checkpoint_policy

    auto = model.get("gradient_checkpointing") == AUTO
    node = {**model, "gradient_checkpointing": False} if auto else model
    policy = build_policy_from(node, int(cfg.seed))
    learner_plan(cfg, plan, base_of(policy).config)
    for key, value in (("data.max_tokens_per_micro_batch", plan.max_tokens_per_micro_batch),
                       ("model.gradient_checkpointing", plan.gradient_checkpointing)):  # fmt: skip
        if value == AUTO:
            raise ConfigError(key, "auto needs the learner's device visible at start")
    if auto and plan.gradient_checkpointing:
        checkpoint_policy(policy)
    model["gradient_checkpointing"] = plan.gradient_checkpointing
    return policy


def run(cfg: DictConfig, plan: Plan | None = None) -> dict[str, Any]:
    """Train as configured; return the run summary (also written to summary.json)."""
    from omegaconf import OmegaConf

    from frlab.config.preflight import preflight, structured
    from frlab.config.schema import FrlabConfig

    if OmegaConf.get_type(cfg) is not FrlabConfig:  # built by hand: the defaults it leaves out
        cfg = structured(cfg)
    plan = plan or preflight(cfg)
    import lightning as L

    from frlab.learner import FlashReinforceModule
    from frlab.tracking import RunFilesCallback

    quiet_expected_noise()
    output_dir, guard = run_folder(cfg, plan)
    if guard.finished:
        return guard.previous_summary  # a resume of a finished run changes nothing
    # the Trainer, its logger and callbacks first: a bad key there fails in seconds, not after
    # the model loaded (they draw no random numbers, so seeding after them changes nothing)
    run_files = RunFilesCallback(output_dir, components=plan.components)
    callbacks = [*build_callbacks(cfg, run_files), guard.callback]
    trainer = build_trainer(cfg, callbacks, output_dir)
    L.seed_everything(int(cfg.seed), workers=True)
    model = plain(cfg.model)
    tokenizer = load_tokenizer(model)
    check_vocab(model, tokenizer)
    policy = learner_policy(cfg, plan, model)
    run_files.extra["plan"] = plan.to_dict()  # the auto values as chosen
    module = FlashReinforceModule(
        arguments(model), plain(cfg.objective), arguments(plain(cfg.optim)),
        batch_size=plan.batch_size, micro_batch_size=plan.micro_batch_size,
        max_tokens_per_micro_batch=plan.max_tokens_per_micro_batch,
        pack_sequences=plan.pack_sequences,
        temperature=plan.temperature, max_steps=plan.updates, policy=policy,
        built_objective=plan.objective,
        optimizer=instantiate(cfg.optim, key="optim", user_modules=user_modules(cfg)),
    )  # fmt: skip
    pools = pool_factory(cfg, policy, tokenizer,
                         off_policy_correction=plan.objective.uses_off_policy_correction)  # fmt: skip
    datamodule = instantiate(
        cfg.data, key="data", user_modules=user_modules(cfg), pool_factory=pools,
        seed=int(cfg.seed), pad_token_id=int(tokenizer.pad_token_id),
    )  # fmt: skip
    with guard.signals():  # SIGINT/SIGTERM: final checkpoint, then RunInterrupted (130/143)
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    summary = run_files.summary or run_files.finish("finished")
    if cfg.get("plots", True) and trainer.is_global_zero and run_files.rows:
        summary["plots"] = [str(p) for p in write_plots(output_dir)]
    return summary
