"""Generation throughput and weight-sync time of a `frlab.serve` fleet of 1, 2 and 3 servers.

The remote rollout backend (frlab.rollout.remote.engine) spreads requests over a fleet of
generation servers and syncs weights to all of them (snapshot file + load on every server +
version check). This bench starts `--servers` (3) `python -m frlab.serve` processes on loopback
serving one random-init Qwen2, then for n = 1, 2, 3 drives the first n through one
`RemoteEngine`, exactly as the rollout pool does:

- throughput: the same `--requests` requests (one fixed prompt, `--max-new-tokens` each, no
  stop token) with `--concurrency` in flight at a time; generated tokens per second;
- weight sync: `--syncs` times `update_weights` of fresh weights; the median wall time, that
  time divided by n (seconds per server), and the learner-side snapshot write alone.

Sizes are measured `--rounds` times, interleaved (1, 2, 3, 1, 2, 3), and the medians are
printed, each with its ratio against n = 1 measured in the same process. On a machine with
fewer cores than server processes + 1 client the scaling is bounded by the CPU: each server
decodes on one core (`--threads 1`) and the client (HTTP, JSON, asyncio) needs CPU too. So the
bench also prints the CPU time per generated token (servers from /proc, the client's own
process time) and the throughput that cost allows on idle cores; splitting the same requests
over more servers also shrinks each server's decode batch, which raises the CPU per token.

    python bench/fleet.py            # 96 requests x 32 tokens, 24 in flight, ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import torch

from frlab.config.arguments import declared_arguments
from frlab.config.schema import ModelConfig, RemoteConfig
from frlab.defaults import sampling_params
from frlab.model.policy import build_policy, save_policy
from frlab.rollout.remote.engine import RemoteEngine
from frlab.rollout.vllm.snapshot import write_snapshot

PROMPT = [5, 9, 2, 7, 3, 11, 4, 8]


def model_config(args: argparse.Namespace) -> dict[str, Any]:
    """A random-init Qwen2 (10.5M parameters by default): decoding, not HTTP, dominates."""
    return {
        "model_type": "qwen2",
        "vocab_size": args.vocab,
        "hidden_size": args.hidden_size,
        "intermediate_size": 2 * args.hidden_size,
        "num_hidden_layers": args.num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    }


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(urls: list[str], procs: list[subprocess.Popen], timeout_s: float) -> None:
    """Poll every server's /health until all answer (RuntimeError if one exits or times out)."""
    deadline = time.monotonic() + timeout_s
    pending = list(zip(urls, procs, strict=True))
    while pending:
        base, proc = pending[0]
        if proc.poll() is not None:
            raise RuntimeError(f"server {base} exited with {proc.returncode}")
        try:
            if httpx.get(base + "/health", timeout=1.0, trust_env=False).status_code == 200:
                pending.pop(0)
                continue
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"server {base} not healthy after {timeout_s}s")
        time.sleep(0.1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` (all its threads) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def fleet(model_dir: Path, count: int, log_dir: Path) -> Iterator[list[tuple[str, int]]]:
    """`count` frlab.serve processes (1 torch thread each) as (url, pid); killed on exit."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    ports = [unused_port() for _ in range(count)]
    procs: list[subprocess.Popen] = []
    try:
        for port in ports:
            log = (log_dir / f"server-{port}.log").open("w")
            cmd = [
                sys.executable,
                "-m",
                "frlab.serve",
                "--port",
                str(port),
                "--model",
                str(model_dir),
                "--threads",
                "1",
            ]
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, env=env))
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        wait_healthy(urls, procs, timeout_s=180.0)
        yield [(u, p.pid) for u, p in zip(urls, procs, strict=True)]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)


async def generate_all(engine: RemoteEngine, requests: int, args: argparse.Namespace) -> int:
    """Run `requests` requests, `args.concurrency` at a time; return the tokens generated."""
    gate = asyncio.Semaphore(args.concurrency)
    params = sampling_params(max_new_tokens=args.max_new_tokens)

    async def one() -> int:
        async with gate:
            return len((await engine.generate(PROMPT, params)).token_ids)

    return sum(await asyncio.gather(*(one() for _ in range(requests))))


def measure(
    servers: list[tuple[str, int]], policy: Any, args: argparse.Namespace
) -> dict[str, float]:
    """Throughput (and the CPU time it took) and weight-sync time of one engine on `servers`."""
    urls = [u for u, _ in servers]
    fleet = dataclasses.asdict(RemoteConfig(servers=urls, request_timeout_s=300.0))
    engine = RemoteEngine(**fleet, seed=0, weight_update=None, initial_weights=policy.state_dict())
    engine.start()
    try:
        asyncio.run(generate_all(engine, 2 * len(urls), args))  # warm every server up
        cpu0 = [sum(cpu_seconds(pid) for _, pid in servers), time.process_time()]
        t0 = time.perf_counter()
        tokens = asyncio.run(generate_all(engine, args.requests, args))
        gen_s = time.perf_counter() - t0
        server_cpu = sum(cpu_seconds(pid) for _, pid in servers) - cpu0[0]
        client_cpu = time.process_time() - cpu0[1]
        sync_s = []
        for version in range(1, args.syncs + 1):
            state = {k: v + 1e-3 * version for k, v in policy.state_dict().items()}
            t0 = time.perf_counter()
            engine.update_weights(state, version)
            sync_s.append(time.perf_counter() - t0)
    finally:
        engine.shutdown()
    sync = statistics.median(sync_s)
    return {
        "servers": len(urls),
        "tokens": tokens,
        "seconds": gen_s,
        "tokens_per_s": tokens / gen_s,
        "sync_s": sync,
        "sync_s_per_server": sync / len(urls),
        "server_cpu_ms_per_token": 1e3 * server_cpu / tokens,
        "client_cpu_ms_per_token": 1e3 * client_cpu / tokens,
    }


def median_row(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per-key median over the rounds of one fleet size (with every round's tokens/s)."""
    row = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    row["rounds_tokens_per_s"] = [round(r["tokens_per_s"], 1) for r in runs]
    return row


def cpu_bound(row: dict[str, float], cores: int) -> float:
    """Tokens/s the measured CPU cost allows on `cores` idle cores: each 1-thread server uses
    at most one core, and servers plus client share all of them."""
    servers, client = row["server_cpu_ms_per_token"], row["client_cpu_ms_per_token"]
    return 1e3 * min(min(row["servers"], cores) / servers, cores / (servers + client))


def snapshot_write_s(policy: Any, repeats: int = 3) -> float:
    """The learner-side part of a sync: writing the snapshot file (median seconds)."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for version in range(repeats):
            t0 = time.perf_counter()
            write_snapshot(policy.state_dict(), tmp, version)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", type=int, default=3, help="largest fleet measured (1..N)")
    p.add_argument("--requests", type=int, default=96, help="requests per fleet size")
    p.add_argument("--concurrency", type=int, default=24, help="requests in flight at a time")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--syncs", type=int, default=3, help="weight syncs per fleet size (median)")
    p.add_argument("--rounds", type=int, default=2, help="measurements per size (median)")
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    args = parse(argv)
    torch.set_num_threads(1)
    policy = build_policy(
        **declared_arguments(ModelConfig, name_or_path=None, config=model_config(args)),
        seed=args.seed,
    )
    params = sum(p.numel() for p in policy.parameters())
    print(
        f"model: {params / 1e6:.2f}M params; {os.cpu_count()} CPU cores; "
        f"{args.requests} requests x {args.max_new_tokens} tokens, {args.concurrency} in flight; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        save_policy(policy, Path(tmp) / "model")
        with fleet(Path(tmp) / "model", args.servers, Path(tmp)) as servers:
            runs = [
                measure(servers[:n], policy, args)
                for _ in range(args.rounds)
                for n in range(1, args.servers + 1)
            ]  # sizes interleaved, so load from other processes hits every size alike
    rows = [median_row([r for r in runs if r["servers"] == n]) for n in range(1, args.servers + 1)]
    write_s = snapshot_write_s(policy)
    base = rows[0]
    for row in rows:
        print(
            f"{row['servers']:.0f} server(s): {row['tokens_per_s']:8.1f} tokens/s "
            f"(x{row['tokens_per_s'] / base['tokens_per_s']:.2f}); weight sync "
            f"{row['sync_s']:.3f} s (x{row['sync_s'] / base['sync_s']:.2f}), "
            f"{row['sync_s_per_server']:.3f} s per server "
            f"(x{row['sync_s_per_server'] / base['sync_s_per_server']:.2f})"
        )
    print(f"tokens/s per round: {[row['rounds_tokens_per_s'] for row in rows]}")
    for row in rows:
        print(
            f"{row['servers']:.0f} server(s): CPU per token {row['server_cpu_ms_per_token']:.3f} "
            "ms "
            f"in servers + {row['client_cpu_ms_per_token']:.3f} ms in the client; CPU bound on "
            f"{os.cpu_count()} idle cores: {cpu_bound(row, os.cpu_count() or 1):.0f} tokens/s"
        )
    print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    print(f"snapshot write alone (learner side, any fleet size): {write_s:.3f} s")
    print(json.dumps({"rows": rows, "snapshot_write_s": write_s}))
    return rows


if __name__ == "__main__":
    main()
