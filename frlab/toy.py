"""`python -m frlab.toy`: the CPU sanity step.

Builds a tiny random-init causal LM, samples a small batch while recording the sampler's own
log-probs (the behaviour log-probs: what the sampler actually used), runs ONE optimizer update
through the composed
`flashreinforce` objective, and prints the loss, the acceptance rate and how far the parameters
moved. Exits non-zero on any non-finite value. No network, well under 30 s on 2 cores.
"""

from __future__ import annotations

import argparse
import inspect
import math
import sys
import time

import torch

from frlab.data import RolloutBatch


def _cache_kwarg(policy: torch.nn.Module) -> str:
    """transformers 5.2x renamed `past_key_values` to `cache`; accept both spellings."""
    return "cache" if "cache" in inspect.signature(policy.forward).parameters else "past_key_values"


def _cache_of(out: object) -> object:
    return getattr(out, "cache", None) or getattr(out, "past_key_values", None)


@torch.no_grad()
def sample_batch(
    policy: torch.nn.Module,
    prompts: torch.Tensor,
    new_tokens: int,
    temperature: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ancestral sampling with a KV cache; returns (token ids [B,P+N], behaviour log-probs
    [B,N])."""
    out = policy(input_ids=prompts, use_cache=True)
    cache, logits = _cache_of(out), out.logits[:, -1]
    tokens, logps, kwarg = [], [], _cache_kwarg(policy)
    for _ in range(new_tokens):
        log_dist = torch.log_softmax(logits.float() / temperature, dim=-1)
        token = torch.multinomial(log_dist.exp(), 1, generator=generator)
        tokens.append(token)
        logps.append(log_dist.gather(-1, token))
        out = policy(input_ids=token, **{kwarg: cache}, use_cache=True)
        cache, logits = _cache_of(out), out.logits[:, -1]
    return torch.cat([prompts, *tokens], dim=1), torch.cat(logps, dim=1)


def make_batch(
    policy: torch.nn.Module,
    batch_size: int,
    prompt_len: int,
    new_tokens: int,
    vocab: int,
    temperature: float,
    seed: int,
) -> RolloutBatch:
    """One rollout per prompt; reward = fraction of sampled tokens with an even id."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (batch_size, prompt_len), generator=gen)
    ids, behavior = sample_batch(policy, prompts, new_tokens, temperature, gen)
    width = prompt_len + new_tokens
    action = torch.zeros(batch_size, width, dtype=torch.bool)
    action[:, prompt_len:] = True
    behavior_full = torch.zeros(batch_size, width)
    behavior_full[:, prompt_len:] = behavior
    rewards = (ids[:, prompt_len:] % 2 == 0).float().mean(dim=1)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(action),
        action_mask=action,
        position_ids=torch.arange(width).expand(batch_size, width).clone(),
        behavior_log_probs=behavior_full,
        token_versions=torch.where(action, 0, -1),
        rewards=rewards,
        failures=rewards < 0.5,
        truncated=torch.zeros(batch_size, dtype=torch.bool),
        prompt_ids=torch.arange(batch_size),
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: batch size, sampled tokens, learning rate, the KL budget and the seed."""
    p = argparse.ArgumentParser(prog="python -m frlab.toy", description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--delta", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _report(values: dict[str, float], t0: float) -> int:
    """Print the values and the time since `t0`; 1 if one is not finite or nothing moved."""
    for k, v in values.items():
        print(f"{k:>16s}: {v:.6g}")
    print(f"{'seconds':>16s}: {time.perf_counter() - t0:.2f}")
    bad = [k for k, v in values.items() if not math.isfinite(v)]
    if bad:
        print(f"non-finite values: {', '.join(bad)}", file=sys.stderr)
        return 1
    if values["param_delta_l2"] == 0.0:
        print("the update did not move the parameters", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)

    from frlab.config.arguments import declared_arguments
    from frlab.config.schema import ModelConfig
    from frlab.model import build_policy, tiny_config
    from frlab.model.lm_logprobs import sequence_logprobs
    from frlab.objective import Objective

    t0 = time.perf_counter()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    vocab = 64
    model = declared_arguments(
        ModelConfig, name_or_path=None, config=tiny_config("qwen2", vocab_size=vocab)
    )
    policy = build_policy(**model, seed=args.seed)
    batch = make_batch(policy, args.batch_size, 8, args.new_tokens, vocab, 1.0, args.seed)
    objective = Objective.from_preset(
        "flashreinforce", params={"sequence_bernoulli_kl": {"delta": args.delta}}
    )
    before = [q.detach().clone() for q in policy.parameters()]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0)

    log_probs, _ = sequence_logprobs(
        policy,
        batch.input_ids,
        batch.attention_mask,
        batch.position_ids,
        action_mask=batch.action_mask,
    )
    advantages = objective.advantages(batch.rewards, batch.prompt_ids)
    loss, diag = objective(log_probs, batch.behavior_log_probs, advantages, batch.action_mask)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    moved = math.sqrt(
        sum(
            float((q.detach() - b).pow(2).sum())
            for q, b in zip(policy.parameters(), before, strict=True)
        )
    )

    values = {
        "loss": float(loss.detach()),
        "acceptance_rate": float(diag["acceptance_rate"]),
        "sequence_kl_max": float(diag["sequence_kl"].max()),
        "reward_mean": float(batch.rewards.mean()),
        "grad_norm": float(grad_norm),
        "param_delta_l2": moved,
    }
    return _report(values, t0)


if __name__ == "__main__":
    sys.exit(main())
