"""What a fleet outage costs a run, measured as a user meets it: `python -m frlab rollout=remote`
on the toy task against one `python -m frlab.serve` server, with that server, once the run has
done `--fault-at` (5) updates of `--updates` (150):

- `restart`: SIGKILLed, then started again on the same port `--down-s` (60) s later;
- `never`: SIGKILLed and never started again: the run stops at
  `rollout.remote.fleet_down_timeout_s` (default 300 s) with exit 75 and `last.ckpt`; then
  the server is started again and the run resumed (`ckpt_path=last`), as the user would;
- `hang`: stopped (SIGSTOP) for `--down-s` s while it serves requests (once the weight push
  of that update is logged), then continued (SIGCONT);
- `hang-at-push`: the same, stopped as soon as the update is in metrics.csv: the weight push
  that follows each update meets the stopped server.

For each case it prints the run's exit code, updates done, prompts dropped as failed (by
reason), prompts requeued (by reason), the outages (count, longest, total seconds), the lines
and bytes of the run's frlab.log, and for `never` how long the run took to stop after the
kill, the prompts its checkpoint holds to run again and what the resumed run did (its log
figures: the lines the resume added). `fault_lines` counts the log lines that tell faults
(warnings, outage and server lines); every update also logs one weight-sync line. Every wait
has a deadline; the results are also written to `<out>/results.json`. The numbers in
docs/reliability.md are this script's output.

    python bench/fleet_outages.py                      # the four cases, ~45 min on 2 cores
    python bench/fleet_outages.py --cases hang --down-s 20
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from frlab.rollout.remote.nccl import free_port

REPO = Path(__file__).resolve().parents[1]
MODEL_CONFIG = REPO / "configs/model/toy_qwen2.yaml"
CASES = ("restart", "never", "hang", "hang-at-push")
SERVER_START_S = 300.0  # a server answers /health within this (~5-15 s on 2 cores)
RUN_S = 3600.0  # a run (or a resume) ends within this
POLL_S = 0.2


def env() -> dict[str, str]:
    """The environment of the server and run processes: offline, unbuffered."""
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return {**os.environ, **offline}


def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    """Poll `predicate` until it holds (TimeoutError naming `what` after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(POLL_S)


class Server:
    """One `python -m frlab.serve` process on a fixed loopback port (its log appended)."""

    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it and wait until it answers /health."""
        cmd = [sys.executable, "-m", "frlab.serve", "--port", str(self.port)]
        cmd += ["--model-config", str(MODEL_CONFIG)]
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=out, stderr=out)
        wait_until(self.healthy, SERVER_START_S, f"server {self.url} healthy")

    def healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"server {self.url} exited: {self.log.read_text()[-2000:]}")
        try:
            return httpx.get(self.url + "/health", timeout=1.0, trust_env=False).is_success
        except httpx.HTTPError:
            return False

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL it (continued first if stopped) and reap it."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(30)
        self.proc = None


def start_run(run_dir: Path, server: Server, args: argparse.Namespace, *extra: str) -> Any:
    """`python -m frlab rollout=remote` on the toy task against `server` (console to a file)."""
    cmd = [sys.executable, "-m", "frlab", "rollout=remote"]
    cmd += [f"rollout.remote.servers=[{server.url}]", f"trainer.max_steps={args.updates}"]
    cmd += [f"hydra.run.dir={run_dir}", "plots=false", *extra]
    if args.deadline_s is not None:
        cmd.append(f"rollout.remote.fleet_down_timeout_s={args.deadline_s}")
    console = (run_dir.parent / f"{run_dir.name}.console").open("a")
    return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=console, stderr=subprocess.STDOUT)


def updates(run_dir: Path) -> int:
    """Rows of the run's metrics.csv (one per update)."""
    path = run_dir / "metrics.csv"
    if not path.exists():
        return 0
    with path.open() as fh:
        return sum(1 for row in csv.DictReader(fh) if row.get("step"))


def wait_updates(proc: Any, run_dir: Path, count: int) -> None:
    """Until the run has done `count` updates (RuntimeError if it ended before)."""

    def done() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (exit {proc.returncode}) before {count} updates")
        return updates(run_dir) >= count

    wait_until(done, RUN_S, f"{count} updates")


def finish(proc: Any) -> int:
    """The run's exit code (killed after RUN_S: TimeoutError)."""
    try:
        return proc.wait(RUN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        raise TimeoutError(f"the run did not end within {RUN_S:.0f} s") from None


def told(lines: list[bytes]) -> int:
    """Lines of frlab.log that tell the fleet's faults: warnings, the pool's outage lines and
    the engine's server lines (down, back, refused); not the one weight-sync line per update."""
    marks = (b"][WARNING] - ", b"[frlab.rollout.pool.outages]", b"remote engine: server ")
    return sum(any(m in line for m in marks) for line in lines)


def outcome(run_dir: Path, code: int, log_from: int = 0) -> dict[str, Any]:
    """What the run did: exit code, updates, dropped / requeued prompts, outages, and the
    lines and bytes of frlab.log from byte `log_from` on (all of it, or what a resume added)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    stats = summary.get("rollout_stats") or {}
    log = (run_dir / "frlab.log").read_bytes()[log_from:]
    lines = log.splitlines()
    return {
        "exit": code,
        "status": summary.get("status"),
        "updates": updates(run_dir),
        "failed": stats.get("failed"),
        "failed_by_reason": stats.get("failed_by_reason"),
        "requeued": stats.get("requeued"),
        "requeued_by_reason": stats.get("requeued_by_reason"),
        "outages": stats.get("outages"),
        "log_lines": len(lines),
        "log_bytes": len(log),
        "fault_lines": told(lines),
        "weight_sync_lines": sum(b"remote engine: weights v" in line for line in lines),
    }


def checkpoint_requeued(run_dir: Path) -> dict[str, int]:
    """The prompts `last.ckpt` holds to run again: all, and those an engine fault requeued."""
    ckpt = torch.load(run_dir / "checkpoints/last.ckpt", weights_only=True, map_location="cpu")
    pool = ckpt["RolloutDataModule"]["pool"]
    return {"pending": len(pool["pending"]), "requeued": len(pool["requeues"])}


def case_restart(server: Server, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    proc = start_run(run_dir, server, args)
    wait_updates(proc, run_dir, args.fault_at)
    server.kill()
    time.sleep(args.down_s)
    server.start()
    return outcome(run_dir, finish(proc))


def pushed(run_dir: Path, version: int) -> bool:
    """Whether frlab.log tells the weight push of `version` as done."""
    log = run_dir / "frlab.log"
    return log.exists() and f"remote engine: weights v{version} on ".encode() in log.read_bytes()


def case_hang(
    server: Server, run_dir: Path, args: argparse.Namespace, at_push: bool = False
) -> dict[str, Any]:
    proc = start_run(run_dir, server, args)
    wait_updates(proc, run_dir, args.fault_at)
    if not at_push:
        wait_until(lambda: pushed(run_dir, args.fault_at), RUN_S, "the weight push")
    server.signal(signal.SIGSTOP)
    try:
        time.sleep(args.down_s)
    finally:
        server.signal(signal.SIGCONT)
    return outcome(run_dir, finish(proc))


def case_hang_at_push(server: Server, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    return case_hang(server, run_dir, args, at_push=True)


def case_never(server: Server, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Killed for good (default deadline); then restarted and the run resumed."""
    proc = start_run(run_dir, server, args)
    wait_updates(proc, run_dir, args.fault_at)
    server.kill()
    killed = time.monotonic()
    result = outcome(run_dir, finish(proc))
    result["stopped_after_s"] = round(time.monotonic() - killed, 1)
    result["checkpoint"] = checkpoint_requeued(run_dir)
    server.start()
    before = (run_dir / "frlab.log").stat().st_size
    resumed = start_run(run_dir, server, args, "ckpt_path=last")
    result["resumed"] = outcome(run_dir, finish(resumed), log_from=before)
    return result


RUNS = {"restart": case_restart, "never": case_never, "hang": case_hang}
RUNS["hang-at-push"] = case_hang_at_push


def measure(case: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One case on a fresh server and run folder."""
    server = Server(free_port("127.0.0.1"), root / f"{case}-server.log")
    server.start()
    started = time.monotonic()
    try:
        result = RUNS[case](server, root / case, args)
    finally:
        server.kill()
    return {"case": case, "wall_s": round(time.monotonic() - started, 1), **result}


def row(result: dict[str, Any], args: argparse.Namespace) -> str:
    """One markdown table row: updates, dropped, requeued, outages, log."""
    dropped = result["failed"]
    reasons = ", ".join(f"`{k}` {v}" for k, v in (result["failed_by_reason"] or {}).items())
    requeued = ", ".join(f"`{k}` {v}" for k, v in (result["requeued_by_reason"] or {}).items())
    outages = result["outages"] or {}
    return (
        f"| {result['case']} | exit {result['exit']}, {result['updates']}/{args.updates} | "
        f"{dropped}{f' ({reasons})' if reasons else ''} | {result['requeued']}"
        f"{f' ({requeued})' if requeued else ''} | {outages.get('count')}, longest "
        f"{outages.get('longest_s', 0):.0f} s | {result['log_lines']} lines "
        f"({result['fault_lines']} on faults), {result['log_bytes'] / 1024:.0f} KiB |"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {CASES}")
    p.add_argument("--updates", type=int, default=150, help="trainer.max_steps of each run")
    p.add_argument("--fault-at", type=int, default=5, help="updates done before the fault")
    p.add_argument("--down-s", type=float, default=60.0, help="restart / SIGCONT after this")
    p.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="rollout.remote.fleet_down_timeout_s (default: the run's, 300 s)",
    )
    p.add_argument("--out", default=None, help="folder of the runs (default: a temp folder)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; choose from {CASES}")
    root = Path(args.out or tempfile.mkdtemp(prefix="fleet_outages_"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"runs in {root}; {os.cpu_count()} cores, load average {os.getloadavg()}", flush=True)
    results = []
    for case in cases:
        results.append(measure(case, root, args))
        print(json.dumps(results[-1]), flush=True)
        (root / "results.json").write_text(json.dumps(results, indent=1))
    print("| case | exit, updates | dropped | requeued | outages | frlab.log |")
    print("|---|---|---|---|---|---|")
    for result in results:
        print(row(result, args))
        if "resumed" in result:
            print(row({"case": "never, resumed", **result["resumed"]}, args))
    print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    return results


if __name__ == "__main__":
    main()
