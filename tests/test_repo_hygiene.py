"""Repository hygiene: no internal issue numbers anywhere in the repository, every repository
path that a config file's comments name exists, and no source file or function is too long.

No internal issue numbers (the word issue before a number, or a number after a hash) in the
docs, the write-ups, bench/, scripts/, tests/ or frlab/: a document cites the paper by title
and section, code and measurements by path.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers.docs import HEADING, LINKED_DOCS, ROOT, split_fences, without_code_spans

ISSUE_WORDS = re.compile(r"\b(?:issues?|PRs?|pull\s+requests?|tickets?)\s*#?\d+\b", re.I)
ISSUE_PAREN = re.compile(r"\(#\d+\)")
ISSUE_BARE = re.compile(r"(?<![\w&#/`])#\d+\b")  # prose of a Markdown file only
SCANNED = ("bench", "scripts", "tests", "frlab", "envs", "configs", "experiments", ".ci")
SCANNED_SUFFIXES = {".py", ".sh", ".sbatch", ".md", ".yaml", ".yml", ".toml", ".txt"}


# --- no internal issue numbers --------------------------------------------------------------


def issue_numbers(path: Path, root: Path = ROOT) -> list[str]:
    """Internal issue references in `path`: the word issue (or PR, ticket) before a number, a
    number after a hash in parentheses, and in a Markdown file's prose any number after a hash."""
    text = path.read_text(errors="replace")
    prose = split_fences(text)[0] if path.suffix == ".md" else text.splitlines()
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        hits = ISSUE_WORDS.findall(line) + ISSUE_PAREN.findall(line)
        if path.suffix == ".md" and not HEADING.match(prose[number - 1]):
            hits += ISSUE_BARE.findall(without_code_spans(prose[number - 1]))
        found += [f"{path.relative_to(root)}:{number}: {hit}" for hit in hits]
    return found


def test_the_issue_number_check_finds_them(tmp_path: Path) -> None:
    hash_ = "#"  # spelled apart, so that this file passes its own check
    sample = tmp_path / "x.md"
    sample.write_text(
        f"Fixed in issue {12}.\nSee ({hash_}7) and {hash_}31 here.\n"
        f"`{hash_}5` in code; a heading is not one:\n\n{hash_}{hash_} 3 x\n"
    )
    hits = [h.split(": ", 1)[1] for h in issue_numbers(sample, tmp_path)]
    assert hits == [f"issue {12}", f"({hash_}7)", f"{hash_}7", f"{hash_}31"], hits


def test_no_internal_issue_numbers() -> None:
    files = [*LINKED_DOCS, ROOT / "pyproject.toml", ROOT / ".ci" / "run"]
    for folder in SCANNED:
        files += [
            p
            for p in sorted((ROOT / folder).rglob("*"))
            if p.suffix in SCANNED_SUFFIXES and p.is_file() and "__pycache__" not in p.parts
        ]
    found = [hit for path in files for hit in issue_numbers(path)]
    assert not found, "\n".join(found)


# --- config comments name real paths --------------------------------------------------------


REPO_PATH = re.compile(
    r"(?<![\w/.~-])((?:frlab|envs|scripts|bench|docs|configs|experiments|tests)/[\w/.-]*\w)"
)


def test_every_repo_path_a_config_comment_names_exists() -> None:
    """Config files point at the code that declares or reads their keys: those paths exist."""
    files = sorted([*(ROOT / "configs").rglob("*.yaml"), *(ROOT / "experiments").rglob("*.yaml")])
    missing = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in REPO_PATH.findall(path.read_text())
        if not (ROOT / name).exists() and not (ROOT / name).with_suffix(".py").exists()
    ]
    assert not missing, "\n".join(missing)


# --- option lists written in the docs are the config groups' options ------------------------

OPTION_LIST = re.compile(r"\b([a-z_]+(?:/[a-z_]+)*)=([a-z_0-9]+(?:\|[a-z_0-9]+)+)")


def option_lists(text: str) -> list[tuple[str, list[str]]]:
    """(group, options) of each `group=a|b|c` a text writes out."""
    return [(m.group(1), m.group(2).split("|")) for m in OPTION_LIST.finditer(text)]


def test_every_option_list_in_the_docs_is_the_groups_options() -> None:
    """`logger=csv|tensorboard|wandb` in a guide (or an error message) lists exactly the
    options of the config group, so an option added as a file cannot be missing from it."""
    from frlab.config.compose import group_options

    docs = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "frlab").rglob("*.py")),
    ]  # error messages and key docs too
    found = 0
    for path in docs:
        for group, listed in option_lists(path.read_text()):
            options = group_options(group)
            if not options:  # a key, not a config group
                continue
            found += 1
            assert sorted(listed) == options, f"{path.name}: {group}={'|'.join(listed)}"
    assert found >= 2  # the generated logger and objective lists of config-keys.md at least
    assert option_lists("pick rollout/engine=torch|vllm here") == [
        ("rollout/engine", ["torch", "vllm"])
    ]


# --- no test folder passes for vLLM --------------------------------------------------------


def test_no_test_folder_is_named_vllm() -> None:
    """pytest puts the folder of each test file on sys.path (tests/rollout for its top-level
    tests), where a subfolder named `vllm` would import as a namespace package: vLLM would look
    installed to `find_spec` and the tier checks. Backend tests use another name
    (tests/rollout/vllm_backend for frlab/rollout/vllm)."""
    named = [
        p.relative_to(ROOT) for p in (ROOT / "tests").rglob("*") if p.is_dir() and p.name == "vllm"
    ]
    assert not named, named


def test_no_two_test_files_share_a_name() -> None:
    """Test folders have no `__init__.py`: pytest imports each test file by its bare name, so a
    second `test_runs.py` in another folder is an import error at collection."""
    seen: dict[str, list[Path]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        seen.setdefault(path.name, []).append(path.relative_to(ROOT))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


# --- size alarms: no file over 600 lines, no function over 80 --------------------------------
# Alarms, not targets: most files are far below them. A file or function that reaches one has
# grown past what reads in one sitting; split it where an idea ends, never to pass the count
# (a file of 450 lines that reads well beats two that do not).

SIZED = ("frlab", "envs", "bench", "scripts")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80  # from `def` to its last line; decorators not counted


def oversized(source: str, name: str) -> list[str]:
    """`name` when `source` is over MAX_FILE_LINES lines, and `name:line: function` for each
    function (nested and async ones too) over MAX_FUNCTION_LINES lines."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_FILE_LINES:
        found.append(f"{name}: {lines} lines (at most {MAX_FILE_LINES})")
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(
                    f"{name}:{node.lineno}: {node.name} is {length} lines "
                    f"(at most {MAX_FUNCTION_LINES})"
                )
    return found


def test_the_size_check_finds_long_files_and_functions() -> None:
    body, n = "    pass\n", MAX_FUNCTION_LINES
    source = (
        "@decorated\n@twice\ndef at_limit():\n"
        + body * (n - 1)  # n lines from the def
        + "async def over():\n"
        + body * n
        + "class C:\n    def method(self):\n"
        + "        pass\n" * (n + 1)
    )
    hits = oversized(source, "x.py")
    over_at, method_at = n + 3, 2 * n + 5
    assert hits == [
        f"x.py:{over_at}: over is {n + 1} lines (at most {n})",
        f"x.py:{method_at}: method is {n + 2} lines (at most {n})",
    ], hits
    limit = MAX_FILE_LINES
    assert oversized("x = 1\n" * limit, "x.py") == []
    assert oversized("x = 1\n" * (limit + 1), "x.py") == [
        f"x.py: {limit + 1} lines (at most {limit})"
    ]


def test_no_file_or_function_sets_off_the_size_alarm() -> None:
    """Code in frlab/, envs/, bench/ and scripts/ stays in pieces one can read whole (the
    alarms above)."""
    files = [
        p
        for folder in SIZED
        for p in sorted((ROOT / folder).rglob("*.py"))
        if "__pycache__" not in p.parts
    ]
    assert len(files) > 50  # the walk found the code
    found = [
        hit for path in files for hit in oversized(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, "\n".join(found)
