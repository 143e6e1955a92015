"""Full fine-tune vs LoRA on the CPU preset's model: learner step time, peak memory, and the
weight push (bytes and time).

The model is SmolLM2-135M-Instruct (`experiment=smollm2_arith_cpu`; `--model toy` for a quick
look), the LoRA arm that of `experiment=smollm2_arith_cpu_lora` (rank 16, alpha 32, every
linear layer but the LM head, frlab.model.lora). The batch is the preset's shape: B=32
trajectories of 47 prompt + 16 reply tokens, random tokens, behaviour log-probs the model's own.

- learner step: one `FlashReinforceModule` update (log-probs, objective, backward, AdamW)
  under a Lightning Trainer, its own `timing/step_s`; arms interleaved in this process
  (`--repeats` rounds after a warm-up), medians and the median of per-round ratios;
- peak memory: each arm's build + `--repeats` updates again in a fresh child process, its
  peak resident memory (Linux `VmHWM`, reset when the child starts) and the bytes of trainable
  parameters, their gradients
  and AdamW's two moments (what LoRA saves by construction);
- weight push: what `WeightSyncCallback` sends (the full state dict, or the adapter only) and
  the time of the torch engine's `update_weights` with it, median over `--pushes`.

Run: `python bench/lora.py` (SmolLM2, converted once from the registry's GGUF package).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learner import OBJECTIVE, build_model, make_batch, one_update  # noqa: E402

from frlab.defaults import torch_engine
from frlab.learner.module import FlashReinforceModule  # noqa: E402
from frlab.model.lora import adapter_state_dict, apply_lora  # noqa: E402

LORA = {"rank": 16, "alpha": 32.0, "dropout": 0.0, "target_modules": ["all-linear"]}
OPTIM = {"full": {"lr": 1e-5}, "lora": {"lr": 1e-4}}  # the presets' learning rates
PROMPT, REPLY, BATCH = 47, 16, 32


def policy_of(arm: str, base: torch.nn.Module) -> torch.nn.Module:
    policy = copy.deepcopy(base)
    return apply_lora(policy, LORA) if arm == "lora" else policy


def module_of(arm: str, policy: torch.nn.Module) -> FlashReinforceModule:
    optim = {"weight_decay": 0.0, "grad_clip": 1.0, "scheduler": "constant", **OPTIM[arm]}
    return FlashReinforceModule(
        {},
        OBJECTIVE,
        optim,
        batch_size=BATCH,
        policy=policy,
        micro_batch_size=BATCH,
        pack_sequences=True,
    )


def the_batch(base: torch.nn.Module) -> Any:
    n = PROMPT + REPLY
    return make_batch(base, [n] * BATCH, seed=0, prompt_frac=PROMPT / n)


def trainable_state_bytes(policy: torch.nn.Module) -> int:
    """Trainable parameters + their gradients + AdamW's two moments, in bytes."""
    return sum(4 * p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad)


def push(policy: torch.nn.Module, pushes: int) -> tuple[int, float]:
    """(bytes sent, median seconds of the torch engine's update_weights) for this policy."""
    from frlab.model.lora import is_peft

    state = policy.state_dict()
    sent = adapter_state_dict(state) if is_peft(policy) else state
    engine = torch_engine(policy, max_batch_size=1)
    engine.start()
    try:
        times = []
        for version in range(1, pushes + 1):
            start = time.perf_counter()
            engine.update_weights(sent, version)
            times.append(time.perf_counter() - start)
    finally:
        engine.shutdown()
    nbytes = sum(t.numel() * t.element_size() for t in sent.values())
    return nbytes, statistics.median(times)


def reset_peak_rss() -> None:
    """Reset this process's peak RSS (Linux: a forked child starts with its parent's)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss() -> int:
    """This process's peak resident memory since the last reset, in bytes (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(arm: str, model: str, repeats: int) -> None:
    """One arm alone in this process: print its peak memory as JSON."""
    reset_peak_rss()
    base = build_model(model, "float32").train()
    policy = policy_of(arm, base)
    batch, module = the_batch(base), module_of(arm, policy)
    del base
    for _ in range(repeats):
        one_update(module, batch, "cpu")
    print(json.dumps({"peak_rss": peak_rss(), "state": trainable_state_bytes(policy)}))


def peak_memory(arm: str, model: str, repeats: int) -> dict[str, int]:
    cmd = [sys.executable, __file__, "--child", arm, "--model", model, "--repeats", str(repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (the preset's) or toy")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--child", choices=("full", "lora"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import logging

    for name in ("lightning", "lightning.pytorch", "lightning.pytorch.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if args.child:
        return child(args.child, args.model, args.repeats)
    base = build_model(args.model, "float32").train()
    batch = the_batch(base)
    policies = {arm: policy_of(arm, base) for arm in ("full", "lora")}
    modules = {arm: module_of(arm, p) for arm, p in policies.items()}
    steps: dict[str, list[float]] = {arm: [] for arm in modules}
    for round_ in range(args.repeats + 1):
        for arm, module in modules.items():
            seconds = one_update(module, batch, "cpu")["timing/step_s"]
            if round_:  # round 0 warms up
                steps[arm].append(seconds)
        if round_:
            print(f"round {round_}: " + ", ".join(f"{a} {s[-1]:.2f}s" for a, s in steps.items()))
    pushed = {arm: push(p, args.pushes) for arm, p in policies.items()}
    memory = {arm: peak_memory(arm, args.model, args.repeats) for arm in modules}
    trainable = {
        a: sum(p.numel() for p in q.parameters() if p.requires_grad) for a, q in policies.items()
    }
    for arm in modules:
        mib = memory[arm]["peak_rss"] / 2**20
        print(
            f"{arm:4s}: trainable {trainable[arm] / 1e6:7.2f}M params, step "
            f"{statistics.median(steps[arm]):.2f} s, peak RSS {mib:.0f} MiB, trainable state "
            f"{memory[arm]['state'] / 2**20:.1f} MiB, push {pushed[arm][0] / 2**20:.2f} MiB in "
            f"{pushed[arm][1] * 1e3:.1f} ms"
        )
    step = statistics.median(f / lo for f, lo in zip(steps["full"], steps["lora"], strict=True))
    print(f"full/lora learner step time: {step:.2f}")
    print(f"full/lora peak memory: {memory['full']['peak_rss'] / memory['lora']['peak_rss']:.2f}")
    print(f"full/lora push bytes: {pushed['full'][0] / pushed['lora'][0]:.1f}")
    print(f"full/lora push time: {pushed['full'][1] / pushed['lora'][1]:.1f}")


if __name__ == "__main__":
    main()
