"""The paper presets' math data, read from local files with the named datasets' exact layouts.

Hub datasets cannot be downloaded in tests, so each test writes a small file with the column
layout of the dataset a preset names, and reads it the way the preset does:

- sail/Sanity-Test-R1D-1.5B (r1): `train/math_1460.parquet` for training and
  `test/aime_2024.parquet`, `test/aime_2025.parquet` for evaluation (file names: THUDM/slime
  `examples/flash_reinforce/README.md`, "the dataset is read as-is"; sail-sg/Precision-RL's verl
  scripts read `sanity_test/math_1460.parquet` and `aime_202{4,5}.parquet`). Layout: verl's RL
  parquet, `prompt` a list of chat messages that already asks for a \\boxed{} answer and
  `reward_model` holding `ground_truth` (slime README; the reference launcher passes
  `--data.input_key prompt --data.label_key reward_model`; verl's reward manager reads
  `data_source`). `ability` and `extra_info` follow verl's layout and are not read here.
- BytedTsinghua-SIA/DAPO-Math-17k (qwen_math, tool settings): `data_source` string, `prompt`
  list<struct<content, role>>, `ability` string, `reward_model` struct<ground_truth, style>,
  `extra_info` struct<index> (the dataset card's `dataset_info`, as mirrored on the hub by
  LuyiCui/DAPO-Math-17k and koajoel/DAPO-Math-17k-dedup), config `default`, split `train`,
  ~1.79M rows with repeated prompts (NVIDIA-NeMo/labs-molt `examples/python/utils/
  prepare_dapo.py`, which deduplicates on the user message and keeps first occurrences; the
  reference trains on the first 7,500 rows: labs-molt `molt/trainer/rl_trainer.py` selects
  `range(max_samples)`). The user message wraps the problem in DAPO's "Answer:" instructions.
- math-ai/olympiadbench (five-benchmark arm): split test, `question` and `final_answer`, a list
  holding one answer (public readers of that dataset take the list's element).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from envs.math import MathEnv, load_math_dataset
from envs.math.export import dapo_problem, export_jsonl

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

MESSAGES = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
REWARD = pa.struct([("ground_truth", pa.string()), ("style", pa.string())])
SANITY_EXTRA = pa.struct([("index", pa.int64()), ("split", pa.string())])
DAPO_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", MESSAGES),
        ("ability", pa.string()),
        ("reward_model", REWARD),
        ("extra_info", pa.struct([("index", pa.string())])),
    ]
)
SANITY_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", MESSAGES),
        ("ability", pa.string()),
        ("reward_model", REWARD),
        ("extra_info", SANITY_EXTRA),
    ]
)
BOXED = " Let's think step by step and output the final answer within \\boxed{}."
DAPO_HEAD = (
    "Solve the following math problem step by step. The last line of your response should be "
    "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem."
)
DAPO_TAIL = 'Remember to put your answer on its own line after "Answer:".'


def dapo_prompt(problem: str) -> str:
    return f"{DAPO_HEAD}\n\n{problem}\n\n{DAPO_TAIL}"


def sanity_rows(problems: list[tuple[str, str]], source: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": source,
            "prompt": [{"content": q + BOXED, "role": "user"}],
            "ability": "math",
            "reward_model": {"ground_truth": a, "style": "rule"},
            "extra_info": {"index": i, "split": "test"},
        }
        for i, (q, a) in enumerate(problems)
    ]


def write_sanity_dataset(root: Path) -> Path:
    """A local copy of sail/Sanity-Test-R1D-1.5B's file tree, 3 + 2 + 2 problems."""
    train = [("What is $3 \\cdot 4$?", "12"), ("Half of 1?", "\\frac{1}{2}"), ("1+1?", "2")]
    files = {
        "train/math_1460.parquet": sanity_rows(train, "math"),
        "test/aime_2024.parquet": sanity_rows([("AIME 24 #1", "204"), ("#2", "25")], "aime24"),
        "test/aime_2025.parquet": sanity_rows([("AIME 25 #1", "70"), ("#2", "588")], "aime25"),
    }
    for name, rows in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=SANITY_SCHEMA), root / name)
    return root


DAPO_PROBLEMS = [
    ("Find $x$ if $2x=6$.", "3"),
    ("Compute $7 \\cdot 6$.", "42"),
    ("Find $x$ if $2x=6$.", "3"),
    ("What is $10-1$?", "9"),
    ("Compute $7 \\cdot 6$.", "42"),
    ("How many primes below 10?", "4"),
]


def write_dapo_parquet(path: Path) -> Path:
    """DAPO-Math-17k's layout, with the repeated prompts the hub dataset has."""
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"content": dapo_prompt(q), "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": a, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"id-{i}"},
        }
        for i, (q, a) in enumerate(DAPO_PROBLEMS)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=DAPO_SCHEMA), path)
    return path


def test_sanity_train_file_gives_chat_tasks_graded_on_reward_model(tmp_path: Path) -> None:
    root = write_sanity_dataset(tmp_path / "Sanity-Test-R1D-1.5B")
    kwargs = dict(
        source=str(root / "train/math_1460.parquet"),
        question_key="prompt",
        answer_key="reward_model.ground_truth",
        template="messages",
    )
    env, sampler = MathEnv(**kwargs), MathEnv.task_sampler(**kwargs)
    tasks = [sampler.sample(random.Random(0)) for _ in range(3)]
    assert sorted(t["answer"] for t in tasks) == ["12", "2", "\\frac{1}{2}"]
    task = next(t for t in tasks if t["answer"] == "12")
    assert task["question"] == "What is $3 \\cdot 4$?" + BOXED  # the user message's text
    # The episode opens with the file's own chat messages, verbatim.
    assert env.reset(task) == [{"role": "user", "content": "What is $3 \\cdot 4$?" + BOXED}]
    assert env.step("3 * 4 = 12, so \\boxed{12}.").reward == 1.0
    env.reset(task)
    assert env.step("\\boxed{13}").reward == 0.0


def test_sanity_test_split_feeds_the_r1_aime_evaluation(tmp_path: Path) -> None:
    from envs.math.evaluate import evaluate_avg_at_k
    from frlab.evaluation.benchmarks import load_benchmark

    root = write_sanity_dataset(tmp_path / "Sanity-Test-R1D-1.5B")
    spec = {"question_key": "prompt", "answer_key": "reward_model.ground_truth"}
    benchmarks = {
        name: load_benchmark(name, {"source": str(root / f"test/{file}.parquet"), **spec}, None)
        for name, file in (("AIME24", "aime_2024"), ("AIME25", "aime_2025"))
    }
    asked: list[list[dict[str, str]]] = []

    def generate(prompts: list[list[dict[str, str]]]) -> list[str]:
        asked.extend(prompts)  # AIME24 #1 right twice, every other reply wrong
        return [
            "\\boxed{204}" if "AIME 24 #1" in p[0]["content"] else "\\boxed{0}" for p in prompts
        ]

    metrics = evaluate_avg_at_k(generate, benchmarks, 2, template="messages")
    assert metrics == {
        "eval/AIME24/avg@2": 0.5,
        "eval/AIME25/avg@2": 0.0,
        "eval/AIME24/avg@2_se": 0.5,
        "eval/AIME25/avg@2_se": 0.0,
        "eval/mean/avg@2": 0.25,
    }
    assert asked[0] == [{"role": "user", "content": "AIME 24 #1" + BOXED}]
    assert len(asked) == 8


def test_messages_template_refuses_tasks_without_messages() -> None:
    env = MathEnv(dataset=[{"question": "1+1?", "answer": "2"}], template="messages")
    with pytest.raises(ValueError, match="env.template=messages"):
        env.reset({"question": "1+1?", "answer": "2"})


def test_dapo_dedup_keeps_first_rows_then_limits(tmp_path: Path) -> None:
    path = write_dapo_parquet(tmp_path / "dapo.parquet")
    keys = {"question_key": "prompt", "answer_key": "reward_model.ground_truth"}
    unique = load_math_dataset(str(path), deduplicate=True, **keys)
    assert [t["answer"] for t in unique] == ["3", "42", "9", "4"]
    assert [t["answer"] for t in load_math_dataset(str(path), **keys)] == [
        a for _, a in DAPO_PROBLEMS
    ]
    first3 = load_math_dataset(str(path), deduplicate=True, limit=3, **keys)
    assert [t["question"] for t in first3] == [dapo_prompt(q) for q, _ in DAPO_PROBLEMS[:2]] + [
        dapo_prompt("What is $10-1$?")
    ]
    assert first3[0]["messages"] == [{"role": "user", "content": dapo_prompt(DAPO_PROBLEMS[0][0])}]
    # DAPO's "Answer: X" line is graded.
    env = MathEnv(dataset=list(first3), template="messages")
    env.reset(first3[1])
    assert env.step("7 * 6 = 42\nAnswer: 42").reward == 1.0


def test_qwen_math_preset_reads_the_hub_dataset_as_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preset's env node loads DAPO-Math-17k (config default, split train) through
    `datasets.load_dataset`, here answering with a real `datasets.Dataset` of that layout."""
    datasets = pytest.importorskip("datasets")
    from frlab.config.compose import compose, instantiate
    from frlab.rollout.pool.factory import task_sampler_factory

    path = write_dapo_parquet(tmp_path / "dapo.parquet")
    calls = []

    def load_dataset(name: str, config: str | None = None, *, split: str) -> Any:
        calls.append((name, config, split))
        return datasets.Dataset.from_parquet(str(path), cache_dir=str(tmp_path / "cache"))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    cfg = compose(["experiment=qwen_math_1p5b", "env.limit=3"])
    env = instantiate(cfg.env, key="env")
    sampler = task_sampler_factory(cfg.env)()
    answers = sorted(sampler.sample(random.Random(1))["answer"] for _ in range(3))
    assert calls == [("BytedTsinghua-SIA/DAPO-Math-17k", "default", "train")]
    assert answers == ["3", "42", "9"]  # the first 3 unique problems
    assert env.reset(env.dataset[0]) == [
        {"role": "user", "content": dapo_prompt(DAPO_PROBLEMS[0][0])}
    ]


def test_tool_prompts_are_the_bare_dapo_problems(tmp_path: Path) -> None:
    from envs.python_tool.env import PythonToolEnv

    path = write_dapo_parquet(tmp_path / "dapo.parquet")
    out = tmp_path / "dapo_math_7500_tool.jsonl"
    n = export_jsonl(
        str(path),
        out,
        question_key="prompt",
        answer_key="reward_model.ground_truth",
        deduplicate=True,
        limit=3,
        problem_only=True,
    )
    assert n == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [
        {"question": "Find $x$ if $2x=6$.", "answer": "3"},
        {"question": "Compute $7 \\cdot 6$.", "answer": "42"},
        {"question": "What is $10-1$?", "answer": "9"},
    ]
    env = PythonToolEnv(data_path=str(out))
    messages = env.reset(env.tasks[0])
    assert messages[1] == {"role": "user", "content": "Find $x$ if $2x=6$."}
    assert env.step("<answer>3</answer>").reward == 1.0  # only the committed answer is graded
    assert dapo_problem("no DAPO wrapper here") == "no DAPO wrapper here"


def test_export_keeps_the_chat_messages_and_they_read_back(tmp_path: Path) -> None:
    path = write_dapo_parquet(tmp_path / "dapo.parquet")
    out = tmp_path / "dapo_math_7500.jsonl"
    export_jsonl(
        str(path),
        out,
        question_key="prompt",
        answer_key="reward_model.ground_truth",
        deduplicate=True,
    )
    back = load_math_dataset(str(out), question_key="messages")
    assert [t["answer"] for t in back] == ["3", "42", "9", "4"]
    assert back[0]["messages"] == [{"role": "user", "content": dapo_prompt(DAPO_PROBLEMS[0][0])}]


def test_olympiadbench_one_element_answer_lists(tmp_path: Path) -> None:
    path = tmp_path / "test.jsonl"
    rows = [
        {"question": "Find $n$.", "final_answer": ["$5$"]},
        {"question": "Find $r$.", "final_answer": ["$\\frac{1}{2}$"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_math_dataset(str(path), answer_key="final_answer")
    assert [t["answer"] for t in data] == ["$5$", "$\\frac{1}{2}$"]
    env = MathEnv(dataset=list(data))
    env.reset(data[1])
    assert env.step("so \\boxed{0.5}").reward == 1.0
    path.write_text(json.dumps({"question": "q", "final_answer": ["1", "2"]}) + "\n")
    with pytest.raises(ValueError, match="exactly one answer"):
        load_math_dataset(str(path), answer_key="final_answer")


def test_dotted_keys_name_the_missing_field(tmp_path: Path) -> None:
    path = write_dapo_parquet(tmp_path / "dapo.parquet")
    with pytest.raises(ValueError, match="no field 'reward_model.answer'"):
        load_math_dataset(str(path), question_key="prompt", answer_key="reward_model.answer")
