"""`MathEnv`: single-turn math with a verifiable 0/1 reward.

One turn: the prompt holds the question in a template, the policy's reply is graded by
`envs.math.grade` against the task's answer (1.0 or 0.0), and the episode ends. A reward
<= 0 marks the trajectory as failed (the label the entropy filter reads).

Templates: `instruct` asks for step-by-step reasoning and a `\\boxed{}` answer in a user turn
(chat models); `base` is a plain "Question: ... Answer:" completion prompt for base models
whose chat template passes the user text through; `messages` sends each task's own chat
messages verbatim (datasets whose question field is a chat message list, e.g. the RL parquet
layout of sail/Sanity-Test-R1D-1.5B and DAPO-Math-17k; the tokenizer's chat template renders
them, as the FlashREINFORCE reference does with its chat template applied); any other string
containing `{question}` is used as a format string, in which a typed `\\n` (backslash, n) is a
newline, so a command line can say 'env.template="{question}\\nGive only the final answer."'
(a LaTeX command that starts with n, such as `\\neq` or `\\nabla`, is kept as written).

`answer_format` picks how the reply's answer is read (envs.math.extract: `any`, or the strict
`boxed` and `final_line`); `system_prompt` is the conversation's system turn: `default` (the
chat template's own, e.g. SmolLM2's 20-token default), `none` (no system turn at all) or the
text itself (applied by the agent loop, frlab.rollout.chat).

Tasks come from a dataset object (`dataset=`, any sequence of {question, answer} mappings)
or from `source=` and the other `load_math_dataset` arguments. The rollout pool builds one
env per episode and draws tasks from `MathEnv.task_sampler` (`MathTasks`: a shuffled pass
over the dataset per epoch); the dataset is loaded on first use and cached per process, so
episodes cost no reload.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envs.base import Env, StepResult, TaskSampler, check_system_prompt, init_arguments
from envs.math.datasets import (
    LOCAL_SUFFIXES,
    MathDataset,
    check_split,
    load_math_dataset,
    source_problem,
)
from envs.math.extract import ANSWER_FORMATS, extract_answer
from envs.math.grading import grade
from envs.math.holdout import check_holdout
from envs.math.templates import MESSAGES, TEMPLATES
from frlab.errors import ConfigError

log = logging.getLogger(__name__)


def prompt_messages(template: str, task: Mapping[str, Any]) -> list[dict[str, str]]:
    """The chat messages that open an episode on `task` with `template` (see module doc)."""
    if template == MESSAGES:
        messages = task.get("messages")
        if not messages:
            raise ConfigError(
                "env.template",
                "env.template=messages needs tasks with chat messages (a dataset whose question "
                "field is a list of {role, content}); this task has none: use instruct or base",
            )
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    fmt = resolve_template(template)
    return [{"role": "user", "content": fmt.format(question=task["question"])}]


# LaTeX commands that begin with `\n`: kept as written by `unescape_newlines`.
_LATEX_N = frozenset(
    "ne neq neg nabla natural nu ni not notin nmid nexists newline nonumber noindent nolimits "
    "ngeq nleq ngtr nless nsubseteq nsupseteq nparallel nearrow nwarrow".split()
)


def unescape_newlines(text: str) -> str:
    """`text` with each typed `\\n` turned into a newline, except where it starts a LaTeX
    command (`\\neq`, `\\nabla`, ...): `{question}\\nGive` -> "{question}" newline "Give"."""

    def replace(match: re.Match[str]) -> str:
        return match.group(0) if match.group(1) in _LATEX_N else "\n" + match.group(1)[1:]

    return re.sub(r"(?<!\\)\\(n[A-Za-z]*)", replace, text)


def resolve_template(template: str) -> str:
    """The format string for `template` (a TEMPLATES name or a string with `{question}`,
    typed `\\n` escapes turned into newlines)."""
    if template in TEMPLATES:
        return TEMPLATES[template]
    if isinstance(template, str) and "{question}" in template:
        return unescape_newlines(template)
    raise ConfigError(
        "env.template",
        f"must be one of {sorted([*TEMPLATES, MESSAGES])} or contain "
        f"'{{question}}', got {template!r}",
    )


@functools.lru_cache(maxsize=16)
def _cached_dataset(key: str) -> MathDataset:
    """load_math_dataset for a JSON-encoded argument set (hashable cache key)."""
    args = json.loads(key)
    return load_math_dataset(args.pop("source"), args.pop("split"), **args)


def load_arguments(
    source: str | None,
    split: str | None,
    dataset: Sequence[Mapping[str, Any]] | None,
    *,
    question_key: str | None = None,
    answer_key: str | None = None,
    limit: int | None = None,
    subset: str | None = None,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    holdout: Mapping[str, Any] | None = None,
    deduplicate: bool = False,
) -> dict[str, Any]:
    """The checked `load_math_dataset` arguments of an env node (the dataset's cache key);
    a ValueError or FileNotFoundError names the env key at fault."""
    if (source is None) == (dataset is None):
        raise ValueError("MathEnv needs exactly one of env.source or a dataset object")
    if source is not None and Path(source).suffix.lower() in LOCAL_SUFFIXES:
        if not Path(source).expanduser().is_file():  # fail at config time, not in the pool
            raise FileNotFoundError(f"env.source: dataset file not found: {source}")
    check_split(source, split, "env.split")  # type: ignore[arg-type]
    return {
        "source": source,
        "split": split,
        "question_key": question_key,
        "answer_key": answer_key,
        "limit": limit,
        "subset": subset,
        "seed": int(seed),
        "options": dict(options or {}),
        "deduplicate": bool(deduplicate),
        "holdout": check_holdout(holdout, "env.holdout"),
    }


LOAD_KEYS = (
    "question_key",
    "answer_key",
    "limit",
    "subset",
    "seed",
    "options",
    "holdout",
    "deduplicate",
)


def resolve_dataset(
    dataset: Sequence[Mapping[str, Any]] | None, load_args: Mapping[str, Any]
) -> Sequence[Mapping[str, Any]]:
    """`dataset` itself, else the dataset `load_args` name (loaded once per process)."""
    if dataset is not None:
        return dataset
    return _cached_dataset(json.dumps(dict(load_args), sort_keys=True))


class MathTasks(TaskSampler):
    """A shuffled pass over the dataset: every task once per epoch, the order reshuffled with
    the pool's RNG at the start of each epoch. The rest of the pass is checkpointed."""

    def __init__(
        self, dataset: Sequence[Mapping[str, Any]] | None, load_args: Mapping[str, Any]
    ) -> None:
        self._dataset, self._load_args = dataset, dict(load_args)
        self._order: list[int] = []
        self._restored_size: int | None = None  # dataset size the restored order was made for

    @property
    def dataset(self) -> Sequence[Mapping[str, Any]]:
        """The tasks (loaded on the first draw, shared by every env with the same arguments)."""
        if self._dataset is None:
            self._dataset = resolve_dataset(None, self._load_args)
        return self._dataset

    def sample(self, rng: random.Random) -> dict[str, Any]:
        """The next task of the pass (a new shuffled pass when this one is spent)."""
        if self._restored_size is not None:
            self._check_restored(self._restored_size)
        if not self._order:
            self._order = list(range(len(self.dataset)))
            rng.shuffle(self._order)
        return dict(self.dataset[self._order.pop()])

    def _check_restored(self, size: int) -> None:
        self._restored_size = None
        if size != len(self.dataset) or any(not 0 <= i < size for i in self._order):
            log.warning(
                "the checkpoint's pass over %d math tasks does not fit the dataset of %d: "
                "a new shuffled pass starts",
                size,
                len(self.dataset),
            )
            self._order = []

    def state_dict(self) -> dict[str, Any]:
        """The task indices left in this pass (drawn from the end) and the dataset size."""
        size = None if self._dataset is None else len(self._dataset)
        return {"order": list(self._order), "dataset_size": size}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._order = [int(i) for i in state.get("order") or ()]
        size = state.get("dataset_size")
        self._restored_size = int(size) if self._order and size is not None else None


class MathEnv(Env):
    """Single-turn math environment (reward = grade(reply, answer))."""

    @classmethod
    def missing_sources(cls, config: Mapping[str, Any]) -> dict[str, str]:
        """`env.source` must be loadable here (file, package, or cached dataset offline)."""
        source = config.get("source")
        problem = (
            None
            if source is None
            else source_problem(source, config.get("split"), config.get("subset"))
        )
        return {"source": problem} if problem else {}

    @classmethod
    def task_sampler(cls, **kwargs: Any) -> MathTasks:
        """A shuffled pass over the env node's dataset (loaded on the first draw)."""
        args = init_arguments(cls, kwargs)
        dataset = args["dataset"]
        load = {key: args[key] for key in LOAD_KEYS}
        return MathTasks(dataset, load_arguments(args["source"], args["split"], dataset, **load))

    def __init__(
        self,
        source: str | None = None,
        split: str | None = None,
        *,
        question_key: str | None = None,
        answer_key: str | None = None,
        limit: int | None = None,
        subset: str | None = None,
        seed: int = 0,
        options: Mapping[str, Any] | None = None,
        holdout: Mapping[str, Any] | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        template: str = "instruct",
        answer_format: str = "any",
        system_prompt: str = "default",
        timeout_s: float = 5.0,
        deduplicate: bool = False,
    ) -> None:
        self._load_args = load_arguments(
            source,
            split,
            dataset,
            question_key=question_key,
            answer_key=answer_key,
            limit=limit,
            subset=subset,
            seed=seed,
            options=options,
            holdout=holdout,
            deduplicate=deduplicate,
        )
        if not float(timeout_s) > 0:
            raise ConfigError("env.timeout_s", f"must be > 0, got {timeout_s}")
        if answer_format not in ANSWER_FORMATS:
            raise ConfigError(
                "env.answer_format",
                f"must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}",
            )
        self.template_name = str(template)
        self.template = template if template == MESSAGES else resolve_template(template)
        self.answer_format = answer_format
        self.system_prompt = check_system_prompt(system_prompt, "env.system_prompt")
        self.timeout_s = float(timeout_s)
        self._dataset = dataset
        self._answer: str | None = None

    @property
    def dataset(self) -> Sequence[Mapping[str, Any]]:
        """The tasks (loaded on first use, shared by every env and sampler with the same
        arguments)."""
        if self._dataset is None:
            self._dataset = resolve_dataset(None, self._load_args)
        return self._dataset

    def prompt(self, question: str) -> str:
        """The user message for `question` (format-string templates)."""
        return resolve_template(self.template_name).format(question=question)

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        question, answer = task.get("question"), task.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise ValueError("math task field 'question' must be a non-empty string")
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise ValueError(f"math task field 'answer' must be a string or number: {answer!r}")
        self._answer = str(answer)
        return prompt_messages(self.template_name, task)

    def step(self, action_text: str) -> StepResult:
        if self._answer is None:
            raise RuntimeError("MathEnv.step called before reset (or after the episode ended)")
        answer, self._answer = self._answer, None
        fmt = self.answer_format
        reward = grade(action_text, answer, timeout_s=self.timeout_s, answer_format=fmt)
        info = {"answer": answer, "extracted": extract_answer(action_text, fmt)}
        return StepResult(observation=None, reward=reward, done=True, info=info)
