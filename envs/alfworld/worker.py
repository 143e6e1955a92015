"""One ALFWorld game in its own process, driven over a pipe, with a timeout on every call.

ALFWorld's TextWorld parser keeps global state and is not safe to share between threads, and
a game step can hang (a pathological command, the planner), so each episode owns a
`GameWorker`: a child process that loads one game and answers `step` requests. The child is a
fresh interpreter (`python -c` calling `main`; not a fork, as the rollout pool runs threads;
not multiprocessing's spawn, which re-imports the caller's main script) in its own session,
talking over a socket pair. The parent waits at most `timeout_s` for each answer; a worker
that does not answer in time is killed and the call raises `WorkerTimeout`, which fails that
rollout with a clear error instead of stalling the pool. `close()` always kills the child's
whole session.

Protocol (picklable tuples): the child sends ("ready", Turn) after loading, then ("turn", Turn)
for every command it receives; ("error", text) reports an exception; the parent sends a command
string, or None to stop.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

SERVE = "envs.alfworld.worker:serve"
_CHILD = "import sys; from envs.alfworld.worker import main; main(sys.argv[1:])"


@dataclass
class Turn:
    """What the game says after a reset or a command."""

    observation: str
    admissible: list[str]
    won: bool
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class WorkerError(RuntimeError):
    """The game worker failed (crashed, died or reported an exception)."""


class WorkerTimeout(WorkerError):
    """The game worker did not answer within its timeout; it has been killed."""


def _load_game(game_file: str, max_episode_steps: int) -> Any:
    """A textworld gym env for one ALFRED game, with ALFWorld's demangler and info wrappers."""
    import textworld  # noqa: PLC0415 - optional extra, only inside the worker
    import textworld.gym  # noqa: PLC0415
    from alfworld.agents.environment.alfred_tw_env import (  # noqa: PLC0415
        AlfredDemangler,
        AlfredInfos,
    )

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    env_id = textworld.gym.register_games(
        [game_file],
        infos,
        batch_size=1,
        asynchronous=False,
        max_episode_steps=max_episode_steps,
        wrappers=[AlfredDemangler(shuffle=False), AlfredInfos],
    )
    return textworld.gym.make(env_id)


def _turn(obs: Any, infos: dict[str, Any], done: Any) -> Turn:
    """Unbatch one textworld gym answer (batch size 1)."""
    won = bool(infos["won"][0])
    return Turn(
        observation=str(obs[0]),
        admissible=[str(a) for a in infos["admissible_commands"][0]],
        won=won,
        done=bool(done[0]) if done is not None else False,
    )


def serve(conn: Any, game_file: str, max_episode_steps: int) -> None:
    """Child entry point: load `game_file`, then answer commands until told to stop."""
    try:
        env = _load_game(game_file, max_episode_steps)
        obs, infos = env.reset()
        conn.send(("ready", _turn(obs, infos, None)))
        while (command := conn.recv()) is not None:
            obs, _scores, dones, infos = env.step([command])
            conn.send(("turn", _turn(obs, infos, dones)))
    except (EOFError, KeyboardInterrupt):
        return
    except Exception:  # noqa: BLE001 - reported to the parent as text
        conn.send(("error", traceback.format_exc()))


class GameWorker:
    """A child process owning one game; `start` then `step` (each with a timeout), `close`.

    `target` ("module:function", called as `function(conn, game_file, max_episode_steps)`)
    is what the child runs; the default serves ALFWorld, tests pass fakes.
    """

    def __init__(self, target: str = SERVE) -> None:
        if ":" not in target:
            raise ValueError(f"worker target must be 'module:function', got {target!r}")
        self.target = target
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, game_file: str, max_episode_steps: int, timeout_s: float) -> Turn:
        """Start the child for `game_file` and return the game's opening turn."""
        self.close()
        ours, theirs = socket.socketpair()
        command = [sys.executable, "-c", _CHILD, str(theirs.fileno()), self.target]
        command += [game_file, str(int(max_episode_steps))]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            self._proc = subprocess.Popen(
                command,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        return self._receive("ready", timeout_s, f"loading {game_file}")

    def step(self, command: str, timeout_s: float) -> Turn:
        """Send one game command; return the game's answer."""
        if not self.alive() or self._conn is None:
            raise WorkerError("ALFWorld game worker is not running (start it first)")
        try:
            self._conn.send(command)
        except OSError as exc:
            self.close()
            raise WorkerError(f"ALFWorld game worker died: {exc!r}") from exc
        return self._receive("turn", timeout_s, f"step {command!r}")

    def _receive(self, kind: str, timeout_s: float, what: str) -> Turn:
        assert self._conn is not None
        try:
            ready = self._conn.poll(float(timeout_s))
            message = self._conn.recv() if ready else None
        except (EOFError, OSError) as exc:
            self.close()
            raise WorkerError(f"ALFWorld game worker died during {what}: {exc!r}") from exc
        if message is None:
            self.close()
            raise WorkerTimeout(f"ALFWorld {what} timed out after {timeout_s} s; worker killed")
        tag, payload = message
        if tag == "error":
            self.close()
            raise WorkerError(f"ALFWorld game worker failed during {what}:\n{payload}")
        if tag != kind or not isinstance(payload, Turn):
            self.close()
            raise WorkerError(f"ALFWorld game worker sent {tag!r} during {what}")
        return payload

    def close(self) -> None:
        """Stop the child: ask it to exit, then kill its whole session (idempotent)."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            if proc is not None and proc.poll() is None:
                try:
                    conn.send(None)
                except OSError:
                    pass
            conn.close()
        if proc is None:
            return
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # also any children the game started
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def main(argv: list[str]) -> None:
    """The child's entry point; argv: FD MODULE:FUNCTION GAME_FILE MAX_STEPS."""
    fd, target, game_file, max_steps = argv
    module, function = target.split(":", 1)
    serve_fn = getattr(importlib.import_module(module), function)
    serve_fn(Connection(int(fd)), game_file, int(max_steps))
