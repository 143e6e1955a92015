"""Task samplers (envs.base.TaskSampler): each env class's `task_sampler` draws, for a given
seed, exactly the tasks its instances' `sample_task` drew before samplers existed (the expected
sequences below were recorded from that code), with the class's own defaults; the default for
an env that only defines `sample_task` draws from one instance; the math sampler's pass over
its dataset survives a checkpoint."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from envs.alfworld import AlfworldEnv
from envs.base import Env, EnvTaskSampler, StepResult, TaskSampler
from envs.math import MathEnv
from envs.python_tool import PythonToolEnv
from envs.toy import FaultyParityEnv, KeyParityEnv, ParityEnv
from frlab.rollout.pool.factory import task_sampler_factory

DATA = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]


def draws(sampler: TaskSampler, seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [sampler.sample(rng) for _ in range(n)]


def game_folder(root: Path, n: int = 6) -> Path:
    """`n` ALFRED-format game folders (empty files: listing them is all sampling needs)."""
    for i in range(n):
        trial = root / "train" / f"task{i}" / "trial"
        trial.mkdir(parents=True)
        (trial / "game.tw-pddl").write_text("{}")
        (trial / "traj_data.json").write_text("{}")
    return root


# (env class, env node kwargs, draws, the part of each task compared, the recorded sequence)
RECORDED = {
    "toy_single": (ParityEnv, {}, 4, lambda t: t["digits"], [[3, 9], [8, 2], [5, 9], [7, 9]]),
    "toy_multi": (
        KeyParityEnv,
        {"num_decoys": 2},
        4,
        lambda t: (t["key"], t["decoys"]),
        [(3, [9, 8]), (2, [5, 9]), (7, [9, 1]), (9, [0, 7])],
    ),
    "toy_faulty": (
        FaultyParityEnv,
        {},
        3,
        lambda t: t["digits"],  # its own default: 3 digits
        [[3, 9, 8], [2, 5, 9], [7, 9, 1]],
    ),
    "math": (
        MathEnv,
        {"dataset": DATA},
        12,
        lambda t: t["question"],
        ["q1", "q4", "q3", "q2", "q0", "q4", "q0", "q2", "q3", "q1", "q3", "q2"],
    ),
    "python_tool": (
        PythonToolEnv,
        {"tasks": DATA},
        8,
        lambda t: t["question"],
        ["q1", "q4", "q4", "q1", "q2", "q4", "q3", "q4"],
    ),
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_each_env_draws_the_tasks_its_instances_drew_for_the_same_seed(name: str) -> None:
    cls, kwargs, n, part, recorded = RECORDED[name]
    assert [part(t) for t in draws(cls.task_sampler(**kwargs), 3, n)] == recorded
    node = OmegaConf.create({"_target_": f"{cls.__module__}.{cls.__name__}", **kwargs})
    through_config = task_sampler_factory(node)()  # what the training run's pool gets
    assert type(through_config) is type(cls.task_sampler(**kwargs))
    assert [part(t) for t in draws(through_config, 3, n)] == recorded
    assert draws(cls.task_sampler(**kwargs), 4, n) != draws(cls.task_sampler(**kwargs), 3, n)


def test_math_draws_a_shuffled_pass_per_epoch_with_the_pool_rng() -> None:
    """The rule behind the recorded sequence: shuffle the indices, take them from the end."""
    rng, tasks = random.Random(3), MathEnv.task_sampler(dataset=DATA)
    got = [tasks.sample(rng)["question"] for _ in range(10)]
    reference, expected = random.Random(3), []
    for _ in range(2):
        order = list(range(len(DATA)))
        reference.shuffle(order)
        expected += [DATA[i]["question"] for i in reversed(order)]
    assert got == expected


@pytest.mark.parametrize(
    ("kwargs", "recorded"),
    [
        ({}, ["task1", "task4", "task4", "task1", "task2", "task4"]),
        ({"num_games": 4, "games_seed": 1}, ["task2", "task2", "task3", "task5", "task0", "task0"]),
    ],
)
def test_alfworld_draws_the_games_its_instances_drew(tmp_path: Path, kwargs, recorded) -> None:
    root = game_folder(tmp_path)
    tasks = AlfworldEnv.task_sampler(data_dir=str(root), **kwargs)
    games = [Path(t["game_file"]).relative_to(root).parts[1] for t in draws(tasks, 3, 6)]
    assert games == recorded
    assert tasks.games() == AlfworldEnv(data_dir=str(root), **kwargs).games()


class OnlyInstanceSampling(Env):
    """A user env that predates samplers: it only defines `sample_task`."""

    def __init__(self, width: int = 3) -> None:
        self.width, self.closed = width, False

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {"q": "x" * rng.randrange(1, self.width + 1)}

    def reset(self, task):
        return [{"role": "user", "content": task["q"]}]

    def step(self, action_text: str) -> StepResult:
        return StepResult(None, 1.0, True)

    def close(self) -> None:
        self.closed = True


def test_an_env_with_only_sample_task_draws_from_one_instance() -> None:
    tasks = OnlyInstanceSampling.task_sampler(width=5)
    assert isinstance(tasks, EnvTaskSampler) and tasks.env.width == 5
    rng = random.Random(0)
    assert draws(tasks, 0, 20) == [OnlyInstanceSampling(5).sample_task(rng) for _ in range(20)]
    assert tasks.state_dict() == {}
    tasks.close()
    assert tasks.env.closed


def test_an_env_that_samples_no_tasks_is_refused_naming_both_ways() -> None:
    class NoTasks(Env):
        def reset(self, task):
            return []

        def step(self, action_text: str) -> StepResult:
            return StepResult(None, 0.0, True)

    with pytest.raises(TypeError, match="task_sampler.*sample_task"):
        NoTasks.task_sampler()
    with pytest.raises(NotImplementedError, match="task_sampler"):
        NoTasks().sample_task(random.Random(0))


def test_config_targets_without_a_sampler_draw_from_one_instance(tmp_path, monkeypatch) -> None:
    """A user module's env class with only `sample_task`, and a function returning an env."""
    package = tmp_path / "samplerpkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import random\nfrom envs.base import Env, StepResult\n\n"
        "class Coin(Env):\n"
        "    def __init__(self, sides=2):\n        self.sides = sides\n"
        "    def sample_task(self, rng):\n        return {'side': rng.randrange(self.sides)}\n"
        "    def reset(self, task):\n        return []\n"
        "    def step(self, text):\n        return StepResult(None, 0.0, True)\n\n"
        "def make_coin(sides=2):\n    return Coin(sides)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "samplerpkg", raising=False)
    expected = [{"side": random.Random(7).randrange(6)}]
    for target in ("samplerpkg.Coin", "samplerpkg.make_coin"):
        node = OmegaConf.create({"_target_": target, "sides": 6})
        tasks = task_sampler_factory(node)()
        assert isinstance(tasks, EnvTaskSampler) and tasks.env.sides == 6
        assert draws(tasks, 7, 1) == expected


def test_math_resumes_its_pass_from_the_checkpointed_state() -> None:
    straight, rng = MathEnv.task_sampler(dataset=DATA), random.Random(5)
    head = [straight.sample(rng) for _ in range(7)]  # one epoch and two tasks of the next
    state = json.loads(json.dumps(straight.state_dict()))  # plain values only
    rng_state = rng.getstate()
    tail = [straight.sample(rng) for _ in range(8)]
    resumed, rng2 = MathEnv.task_sampler(dataset=DATA), random.Random(0)
    resumed.load_state_dict(state)
    rng2.setstate(rng_state)
    assert [resumed.sample(rng2) for _ in range(8)] == tail
    assert state == {"order": state["order"], "dataset_size": 5} and len(state["order"]) == 3
    assert {t["question"] for t in head[5:] + tail[:3]} == {t["question"] for t in DATA}


def test_math_starts_a_new_pass_when_the_state_does_not_fit_the_dataset(caplog) -> None:
    tasks = MathEnv.task_sampler(dataset=DATA[:3])
    tasks.load_state_dict({"order": [4, 0], "dataset_size": 5})
    rng = random.Random(1)
    got = [tasks.sample(rng)["question"] for _ in range(3)]
    assert sorted(got) == ["q0", "q1", "q2"]  # a whole new pass over the 3 tasks
    assert "does not fit the dataset of 3" in caplog.text
    fresh = MathEnv.task_sampler(dataset=DATA)
    fresh.load_state_dict({})  # a checkpoint written before samplers had state
    assert draws(fresh, 3, 5) == draws(MathEnv.task_sampler(dataset=DATA), 3, 5)


def test_a_sampler_that_cannot_be_built_names_env() -> None:
    """A ValueError starting with the key (the run reports it as a config error, exit 2)."""
    node = OmegaConf.create({"_target_": "envs.python_tool.PythonToolEnv"})  # no tasks at all
    with pytest.raises(
        ValueError,
        match=r"^env cannot build its task sampler.*env.tasks or "
        "env.data_path",
    ):
        task_sampler_factory(node)()
    node = OmegaConf.create({"_target_": "envs.toy.ParityEnv", "num_digit": 3})  # misspelt
    with pytest.raises(ValueError, match="env.*num_digit"):
        task_sampler_factory(node)()
