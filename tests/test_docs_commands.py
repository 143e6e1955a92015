"""The commands the documentation shows run in this checkout: the fenced blocks of README.md and
docs/*.md.

- Every `python -m frlab ...` line of a fenced block in README.md and docs/*.md composes
  (`frlab.config.compose.compose`, exactly the config the command line would run with) and
  passes `frlab.config.preflight.preflight`; a multirun (`-m`) is checked at the first value of
  each swept key. Preflight does not ask for the machine, so GPU presets are checked too; a line
  run with the python of vLLM's CPU environment (`.venv-vllm-cpu/bin/python`) is checked as that
  environment sees it (vLLM's platform: the CPU).
- The other commands of the `bash` blocks are parsed: the scripts and test paths they name
  exist, the `--flags` they pass are flags their script declares, and the cheap ones
  (`PRINT_ONLY=1` launch recipes) run for real.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.docs import COMMAND_DOCS, ROOT, split_fences

VLLM_CPU_PYTHON = ".venv-vllm-cpu/bin/python"
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SHELL_LANGS = ("bash", "sh", "shell", "console")
FRLAB_LINE = re.compile(r"python[\d.]*\s+-m\s+frlab(\s|$)")
PLACEHOLDER = re.compile(r"\$|<[^>]*>")


# --- fenced blocks --------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    lines: tuple[str, ...]


def fenced_blocks(path: Path) -> list[Block]:
    _, blocks = split_fences(path.read_text())
    return [Block(path, number, lang, tuple(lines)) for number, lang, lines in blocks]


def command_lines(block: Block) -> list[tuple[int, str]]:
    """The block's logical lines: backslash continuations joined, heredoc bodies and comment
    lines dropped, a `$ ` prompt removed (printouts show commands after one)."""
    out, pending, start, heredoc = [], "", 0, None
    for offset, raw in enumerate(block.lines, 1):
        number = block.line + offset
        if heredoc is not None:
            heredoc = None if raw.strip() == heredoc else heredoc
            continue
        line = raw.strip()
        if not pending:
            start = number
            line = line[2:] if line.startswith("$ ") else line
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if not line or line.startswith("#"):
            continue
        marker = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if marker:
            heredoc = marker.group(1)
        out.append((start, line))
    assert not pending, f"{block.path.name}:{block.line}: a continuation line ends the block"
    return out


def split_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at `&&`, `||`, `;`, `|`, `&`), as words."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands, words = [], []
    for word in lexer:
        if word and set(word) <= set(";&|"):
            commands.append(words)
            words = []
        else:
            words.append(word)
    commands.append(words)
    return [c for c in commands if c]


# --- commands -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrlabCommand:
    where: str
    python: str
    overrides: tuple[str, ...]
    multirun: bool
    env: tuple[str, ...] = ()  # the names its environment assignments set


def split_top_level(value: str) -> list[str]:
    """`value` split at commas outside brackets, braces, parentheses and quotes."""
    parts, depth, quote, current = [], 0, "", ""
    for ch in value:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += ch
    return [*parts, current]


def first_sweep_values(overrides: list[str]) -> list[str]:
    """A multirun's overrides at the first value of each swept key (`a=x,y` -> `a=x`)."""
    out = []
    for override in overrides:
        key, eq, value = override.partition("=")
        out.append(f"{key}={split_top_level(value)[0]}" if eq else override)
    return out


def strip_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env, i = {}, 0
    if words and words[0] == "env":
        i = 1
    while i < len(words) and ENV_ASSIGNMENT.match(words[i]):
        key, _, value = words[i].partition("=")
        env[key] = value
        i += 1
    return env, words[i:]


def is_python(word: str) -> bool:
    return re.fullmatch(r"(.*/)?python(3(\.\d+)?)?", word) is not None


def frlab_command(where: str, words: list[str]) -> FrlabCommand | None:
    """The overrides of a `python -m frlab ...` command (None for anything else)."""
    env, words = strip_env(words)
    if len(words) < 3 or not is_python(words[0]) or words[1:3] != ["-m", "frlab"]:
        return None
    rest = words[3:]
    multirun = any(w in ("-m", "--multirun") for w in rest)
    rest = [w for w in rest if w not in ("-m", "--multirun")]
    overrides = first_sweep_values(rest) if multirun else rest
    return FrlabCommand(where, words[0], tuple(overrides), multirun, tuple(sorted(env)))


def all_commands() -> tuple[list[FrlabCommand], list[tuple[str, dict[str, str], list[str]]]]:
    """Every `python -m frlab` command of a fenced block (any language) of the command docs,
    and every other command of their `bash` blocks, each with its env assignments."""
    frlab, other = [], []
    for path in COMMAND_DOCS:
        for block in fenced_blocks(path):
            if block.lang in ("python", "yaml", "json"):
                continue
            shell = block.lang in SHELL_LANGS
            for number, line in command_lines(block):
                if not shell and not FRLAB_LINE.search(line):
                    continue  # a printout, a diagram: only its frlab commands are checked
                where = f"{path.relative_to(ROOT)}:{number}"
                try:
                    commands = split_commands(line)
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}: {line}") from exc
                for words in commands:
                    command = frlab_command(where, words)
                    if command is not None:
                        frlab.append(command)
                    elif shell:
                        env, rest = strip_env(words)
                        if rest:
                            other.append((where, env, rest))
    return frlab, other


@functools.cache
def commands() -> tuple[list[FrlabCommand], list[tuple[str, dict[str, str], list[str]]]]:
    return all_commands()


def source_of_module(module: str) -> list[Path]:
    """The files of a repository module run with `python -m` (a package: all its files)."""
    base = ROOT.joinpath(*module.split("."))
    if base.with_suffix(".py").is_file():
        return [base.with_suffix(".py")]
    if (base / "__main__.py").is_file():
        return sorted(base.glob("*.py"))
    return []


def undeclared_flags(words: list[str], sources: list[Path]) -> list[str]:
    """The `--flags` of `words` that no source file spells as a string literal."""
    text = "\n".join(p.read_text() for p in sources)
    missing = []
    for word in words:
        if not word.startswith("--") or word == "--help":
            continue
        flag = word.split("=", 1)[0]
        spelled = [flag] + ([f"--{flag[5:]}"] if flag.startswith("--no-") else [])
        if not any(re.search(rf"[\"']{re.escape(f)}[\"']", text) for f in spelled):
            missing.append(flag)
    return missing


# --- tests: commands ------------------------------------------------------------------------


def test_the_command_parser_reads_the_shell_forms_the_docs_use() -> None:
    block = Block(
        ROOT / "x.md",
        1,
        "bash",
        (
            "$ FOO=1 python -m frlab -m a=x,y 'b=[1,2]' \\",
            "    c=3   # a comment",
            "cat > f <<'YAML'",
            "python -m frlab not=me",
            "YAML",
            "python -m frlab.serve --port 8100 &",
            "# a comment line",
        ),
    )
    lines = command_lines(block)
    assert [text for _, text in lines] == [
        "FOO=1 python -m frlab -m a=x,y 'b=[1,2]' c=3   # a comment",
        "cat > f <<'YAML'",
        "python -m frlab.serve --port 8100 &",
    ]
    command = frlab_command("x", split_commands(lines[0][1])[0])
    assert command is not None and command.multirun
    assert command.overrides == ("a=x", "b=[1,2]", "c=3")
    assert frlab_command("x", split_commands(lines[2][1])[0]) is None
    assert split_commands("a && b | c; d & e") == [["a"], ["b"], ["c"], ["d"], ["e"]]


def test_the_docs_show_the_commands_they_describe() -> None:
    """A floor on what is checked: a parser that silently found nothing would pass the rest."""
    assert len(commands()[0]) >= 30, len(commands()[0])
    assert any(c.multirun for c in commands()[0])
    assert any(c.python == VLLM_CPU_PYTHON for c in commands()[0])
    assert len(commands()[1]) >= 20, len(commands()[1])


def preflight_failures(frlab_commands: list[FrlabCommand], patch: pytest.MonkeyPatch) -> list[str]:
    """Compose and preflight each command in this process (fast: no subprocess, no model), up
    to (not including) the machine checks of a real run; one line per command that fails. A
    command run with the python of vLLM's CPU environment sees vLLM's platform as the CPU; one
    that sets the fleet's secret variable (from a file: `FRLAB_FLEET_SECRET="$(< FILE)"`) sees
    a stand-in value."""
    from hydra.utils import get_object

    from frlab.config.compose import compose
    from frlab.config.preflight import preflight

    failures = []
    for command in frlab_commands:
        try:
            cfg = compose(list(command.overrides))
            with patch.context() as local:
                if "FRLAB_FLEET_SECRET" in command.env:
                    local.setenv("FRLAB_FLEET_SECRET", "stand-in-fleet-secret-" * 2)
                if command.python == VLLM_CPU_PYTHON:
                    get_object(str(cfg.rollout.engine._target_))  # its module is loaded
                    for name, module in list(sys.modules.items()):
                        if name.startswith("frlab.") and hasattr(module, "installed_platform"):
                            local.setattr(module, "installed_platform", lambda: "cpu")
                preflight(cfg)
        except Exception as exc:  # noqa: BLE001 - every failure is reported with its line
            failures.append(f"{command.where}: {' '.join(command.overrides)}: {exc}")
    return failures


def test_the_preflight_check_fails_a_wrong_command(monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = FrlabCommand("x.md:1", "python", ("rollout.temperature=0",), False)
    vllm_cpu = FrlabCommand("x.md:2", VLLM_CPU_PYTHON, ("experiment=toy_cpu_vllm",), False)
    assert [f.split(":")[0] for f in preflight_failures([wrong, vllm_cpu], monkeypatch)] == ["x.md"]
    if importlib.util.find_spec("vllm") is None:  # this python: no vLLM, so preflight refuses it
        plain = FrlabCommand("x.md:3", "python", vllm_cpu.overrides, False)
        assert len(preflight_failures([plain], monkeypatch)) == 1


@pytest.mark.slow
def test_every_frlab_command_composes_and_passes_preflight(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m frlab` lines as the command line would run them: compose, then preflight."""
    unique: dict[tuple[str, tuple[str, ...]], FrlabCommand] = {}
    skipped = []
    for command in commands()[0]:
        if any(PLACEHOLDER.search(o) for o in command.overrides):
            skipped.append(command.where)  # a shell variable or a <placeholder>: not concrete
            continue
        unique.setdefault((command.python == VLLM_CPU_PYTHON, command.overrides), command)
    failures = preflight_failures(list(unique.values()), monkeypatch)
    assert not failures, "\n".join(failures)
    assert len(skipped) <= 3, skipped


def test_every_other_command_names_what_exists() -> None:
    """Scripts, modules and test paths exist, and their `--flags` are declared by the script."""
    problems = []
    for where, _env, words in commands()[1]:
        program, args = words[0], words[1:]
        if is_python(program) and args[:1] == ["-m"] and len(args) > 1:
            module, rest = args[1], args[2:]
            if module == "pytest":
                for arg in rest:
                    if arg.startswith("tests"):
                        path = ROOT / arg.split("::", 1)[0]
                        if not path.exists():
                            problems.append(f"{where}: no test path {arg}")
                continue
            if module.split(".")[0] in ("frlab", "envs"):
                sources = source_of_module(module)
                if not sources:
                    problems.append(f"{where}: no module {module} in the repository")
                    continue
                for flag in undeclared_flags(rest, sources):
                    problems.append(f"{where}: {module} declares no {flag}")
        elif is_python(program) and args and args[0].endswith(".py"):
            script = ROOT / args[0]
            if not script.is_file():
                problems.append(f"{where}: no script {args[0]}")
            else:
                for flag in undeclared_flags(args[1:], [script]):
                    problems.append(f"{where}: {args[0]} declares no {flag}")
        elif program in ("bash", "sh", "sbatch"):
            scripts = [a for a in args if a.endswith((".sh", ".sbatch"))]
            if not scripts or not all((ROOT / s).is_file() for s in scripts):
                problems.append(f"{where}: no script in {' '.join(words)}")
    assert not problems, "\n".join(problems)


def test_the_print_only_launch_commands_run() -> None:
    """A documented launch recipe run with PRINT_ONLY=1 only prints its commands: run it."""
    runs = [(w, e, c) for w, e, c in commands()[1] if e.get("PRINT_ONLY") == "1"]
    assert runs, "the GPU guide shows a PRINT_ONLY=1 launch recipe"
    for where, env, words in runs:
        out = subprocess.run(
            words, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, f"{where}: {out.stderr[-2000:]}"
        assert "vllm serve" in out.stdout and "-m frlab" in out.stdout, where
