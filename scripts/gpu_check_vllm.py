"""GPU check of frlab's vLLM paths (run by scripts/gpu_check.sh when vllm is installed).

1. In-process engine (`rollout/engine=vllm`, frlab.rollout.vllm.engine): a random-init
   Qwen2 in bf16 is served by `VLLMEngine` (processed log-probs, frlab's worker extension);
   the behaviour log-probs of sampled tokens are compared with the learner's own
   (`frlab.model.lm_logprobs.sequence_logprobs`, same bf16 weights, same temperature):
   max and mean absolute difference. Then `update_weights` pushes perturbed weights as
   version 1 and the comparison is repeated against the perturbed model (and, as a control,
   against the old one: that difference must be larger, or the update was not applied).
2. One `vllm serve` server with the launch recipes' flags (scripts/launch/fleet.sh), the
   remote engine with filesystem weight sync against it (start, generate, compare log-probs,
   update, version check), then a short `python -m frlab rollout=remote` run (toy task,
   learner on the CPU) against it.

Prints `vllm_<name> <value>` lines and `gpu_check_vllm: OK` / `FAILED: ...`; exit 0 only if
every check passed. Without vllm or CUDA it prints `gpu_check_vllm: SKIPPED (<why>)` and
exits 0 (the non-vLLM part of gpu_check.sh still runs). It has NOT run yet: no GPU machine
with vllm was available when it was written (the lent one has no vllm).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from frlab.config.arguments import declared_arguments
from frlab.config.schema import ModelConfig
from frlab.defaults import make_vllm_engine, sampling_params

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TEMPERATURE = 0.7
# Attention head size 64 (vLLM's GPU kernels do not serve tiny head sizes); vocabulary 64 so
# that the toy preset's tokenizer drives the served model in part 2.
SMALL_QWEN2 = {
    "model_type": "qwen2",
    "vocab_size": 64,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


def skip_reason() -> str | None:
    """Why this check cannot run here (None: it can)."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def abs_diffs(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(max, mean) absolute difference of two equally long sequences of log-probs."""
    if len(a) != len(b) or not a:
        raise ValueError(f"log-prob sequences differ in length or are empty: {len(a)}, {len(b)}")
    diffs = [abs(float(x) - float(y)) for x, y in zip(a, b, strict=True)]
    return max(diffs), sum(diffs) / len(diffs)


def learner_log_probs(model: Any, prompt: list[int], tokens: list[int]) -> list[float]:
    """The learner's log-probs of `tokens` after `prompt` (its chunked head, bf16 weights)."""
    import torch

    from frlab.model.lm_logprobs import sequence_logprobs

    ids = torch.tensor([prompt + tokens], device=model.device)
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, ids, torch.ones_like(ids), temperature=TEMPERATURE)
    return logp[0, len(prompt) :].float().tolist()


def save_model(path: Path, seed: int = 0) -> Any:

    from frlab.model import build_policy
    from frlab.model.policy import save_policy

    model = build_policy(
        **declared_arguments(
            ModelConfig, name_or_path=None, config=dict(SMALL_QWEN2), dtype="bfloat16"
        ),
        seed=seed,
    )
    save_policy(model, path)
    return model.to("cuda").eval()


def compare(name: str, model: Any, results: list[tuple[list[int], Any]]) -> float:
    """Print max / mean |engine - learner| over every sampled token; return the max."""
    engine_lp, learner_lp = [], []
    for prompt, res in results:
        engine_lp += list(res.log_probs)
        learner_lp += learner_log_probs(model, prompt, list(res.token_ids))
    worst, mean = abs_diffs(engine_lp, learner_lp)
    print(f"vllm_{name}_logprob_max_abs_diff {worst:.6f}")
    print(f"vllm_{name}_logprob_mean_abs_diff {mean:.6f}")
    print(f"vllm_{name}_tokens {len(engine_lp)}")
    return worst


def perturbed(model: Any, seed: int = 1) -> dict[str, Any]:
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    return {
        n: (p.detach().float().cpu() + 0.05 * torch.randn(p.shape, generator=g)).to(p.dtype)
        for n, p in model.state_dict().items()
    }


def generate_all(engine: Any, prompts: list[list[int]], new_tokens: int) -> list[Any]:

    params = sampling_params(temperature=TEMPERATURE, max_new_tokens=new_tokens)

    async def go() -> list[Any]:
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    return list(zip(prompts, asyncio.run(go()), strict=True))


def in_process(model_dir: Path, model: Any, args: argparse.Namespace) -> list[str]:
    """Part 1; returns the problems found."""

    problems = []
    prompts = [[(7 * i + j) % 64 for j in range(8)] for i in range(args.prompts)]
    engine = make_vllm_engine(
        str(model_dir),
        seed=0,
        dtype="bfloat16",
        max_model_len=512,
        gpu_memory_utilization=0.3,
        enforce_eager=True,
        skip_tokenizer_init=True,
    )
    engine.start()
    try:
        worst = compare("inprocess_v0", model, generate_all(engine, prompts, args.new_tokens))
        if worst > args.tolerance:
            problems.append(f"in-process log-probs differ from the learner's by {worst:.4f}")
        new = perturbed(model)
        t0 = time.perf_counter()
        engine.update_weights(new, 1)
        print(f"vllm_inprocess_update_s {time.perf_counter() - t0:.3f}")
        model.load_state_dict(new)
        results = generate_all(engine, prompts, args.new_tokens)
        if any(set(r.versions) != {1} for _, r in results):
            problems.append("tokens after the update do not carry version 1")
        worst = compare("inprocess_v1", model, results)
        if worst > args.tolerance:
            problems.append(f"after the update, log-probs differ by {worst:.4f}")
    finally:
        engine.shutdown()
    return problems


def serve_command(model_dir: Path, port: int, secret: Path = Path("fleet.secret")) -> list[str]:
    """The recipes' `vllm serve` command (scripts/launch/fleet.sh start_server, printed) on
    loopback behind the fleet secret in `secret`, from `env` on: vLLM's API key comes from the
    file through the server's environment (`secret_env`), never its command line."""
    script = (
        f"source scripts/launch/fleet.sh && PRINT_ONLY=1 HOST=127.0.0.1 "
        f"FLEET_SECRET_FILE={shlex.quote(str(secret))} start_server 0 {port} "
        f"{shlex.quote(str(model_dir))} 1 512"
    )
    line = subprocess.run(
        ["bash", "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    words = shlex.split(line)
    words = words[words.index("env") :]
    return [*words, "--gpu-memory-utilization", "0.3", "--enforce-eager", "--skip-tokenizer-init"]


def fleet_secret(work: Path) -> Path:
    """The fleet's secret file, made by the launch recipe's own `fleet_secret` (mode 0600)."""
    path = work / "fleet.secret"
    script = f"source scripts/launch/fleet.sh && fleet_secret {shlex.quote(str(path))}"
    subprocess.run(["bash", "-c", script], cwd=REPO, check=True)
    return path


def secret_env(secret: Path) -> dict[str, str]:
    """The server's environment: this one, frlab importable, vLLM's API key from the file."""
    return {
        **os.environ,
        "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}",
        "VLLM_API_KEY": secret.read_text().strip(),
    }


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2.0)
    raise TimeoutError(f"vllm serve not healthy within {timeout}s")


def server(model_dir: Path, model: Any, args: argparse.Namespace, work: Path) -> list[str]:
    """Part 2; returns the problems found."""
    from frlab.config.schema import RemoteConfig
    from frlab.rollout.remote.engine import RemoteEngine

    problems, port = [], args.port
    url, secret = f"http://127.0.0.1:{port}", fleet_secret(work)
    log = (work / "vllm_serve.log").open("w")
    proc = subprocess.Popen(
        serve_command(model_dir, port, secret),
        cwd=REPO,
        env=secret_env(secret),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_healthy(url, proc, args.server_timeout)
        weights = {n: p.detach().cpu() for n, p in model.state_dict().items()}
        fleet = RemoteConfig(
            servers=[url],
            snapshot_dir=str(work / "snapshots"),
            request_timeout_s=60.0,
            secret_file=str(secret),
        )
        engine = RemoteEngine(
            **dataclasses.asdict(fleet), seed=0, weight_update=None, initial_weights=weights
        )
        engine.start()
        try:
            prompts = [[(5 * i + j) % 64 for j in range(8)] for i in range(args.prompts)]
            worst = compare("serve_v0", model, generate_all(engine, prompts, args.new_tokens))
            if worst > args.tolerance:
                problems.append(f"served log-probs differ from the learner's by {worst:.4f}")
            new = perturbed(model, seed=2)
            engine.update_weights(new, 1)
            model.load_state_dict(new)
            results = generate_all(engine, prompts, args.new_tokens)
            worst = compare("serve_v1", model, results)
            if worst > args.tolerance or engine.stats()["servers_healthy"] != 1:
                problems.append(f"after the filesystem sync: diff {worst:.4f}, {engine.stats()}")
        finally:
            engine.shutdown()
        problems += remote_run(url, work)
    except Exception as exc:  # reported, not raised: the rest of gpu_check.sh still runs
        problems.append(f"vllm serve part failed: {exc!r} (log: {work / 'vllm_serve.log'})")
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return problems


def remote_run(url: str, work: Path) -> list[str]:
    """A short `rollout=remote` training run (toy preset, learner on the CPU)."""
    run_dir = work / "remote_run"
    arch = [f"model.config.{k}={v}" for k, v in SMALL_QWEN2.items() if k != "model_type"]
    cmd = [
        sys.executable,
        "-m",
        "frlab",
        "rollout=remote",
        f"rollout.remote.servers=[{url}]",
        f"rollout.remote.secret_file={work / 'fleet.secret'}",
        "trainer.max_steps=3",
        "data.batch_size=16",
        "data.micro_batch_size=16",
        f"hydra.run.dir={run_dir}",
        *arch,
    ]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    print(f"vllm_remote_run_s {time.perf_counter() - t0:.1f}")
    if out.returncode != 0:
        return [f"rollout=remote run failed: {out.stderr[-1500:]}"]
    return []


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--tolerance", type=float, default=0.1, help="max |engine - learner| (bf16)")
    p.add_argument("--port", type=int, default=8199)
    p.add_argument("--server-timeout", type=float, default=240.0)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    why = skip_reason()
    if why is not None:
        print(f"gpu_check_vllm: SKIPPED ({why})")
        return 0
    with tempfile.TemporaryDirectory(prefix="frlab-gpu-vllm-") as tmp:
        work = Path(tmp)
        model = save_model(work / "model")
        problems = in_process(work / "model", model, args)
        model = save_model(work / "model")  # the saved (unperturbed) weights again
        problems += server(work / "model", model, args, work)
    for problem in problems:
        print(f"gpu_check_vllm: FAILED: {problem}")
    print("gpu_check_vllm: OK" if not problems else "gpu_check_vllm: FAILED")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
