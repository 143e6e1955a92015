"""Per-token log-probs of a causal LM without materialising `[B, T, V]` logits.

The learner needs `log pi_theta(y_t | y_<t)` for every policy token (the FlashREINFORCE
token ratio `rho = exp(logp - behaviour)` and the loss are built from it). With 8k-16k token
contexts and 152k vocabularies, `model(...).logits` alone is tens of GB. Instead we run the
decoder to its final hidden states, gather the hidden states of the positions that are scored
(only policy tokens, when an action mask is given) and push them through the LM head in
chunks (frlab.model.lm_head: one float32 chunk of logits alive at a time, sized to the
device).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from frlab.model.lm_head import describe, logprobs_from_hidden
from frlab.model.lora import base_of
from frlab.ops.phases import phase

# Config keys whose models transform logits after the LM head (cap or rescale): the chunked
# head would compute a different distribution, so such models are refused.
SOFTCAP_KEYS = ("final_logit_softcapping", "softcap")
SCALE_KEYS = ("logit_scale", "logits_scaling", "lm_head_multiplier", "output_multiplier")


def lm_parts(model: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """(decoder, lm_head) of a HF causal LM (inside a LoRA PeftModel: its base model, whose
    layers carry the adapters), or a ValueError naming the model type."""
    model = base_of(model)
    config = getattr(model, "config", None)
    mtype = getattr(config, "model_type", type(model).__name__)
    configs = [config]
    if config is not None and hasattr(config, "get_text_config"):
        configs.append(config.get_text_config())
    for cfg in configs:
        for key in SOFTCAP_KEYS:
            if getattr(cfg, key, None) is not None:
                raise ValueError(
                    f"model type {mtype!r} caps its logits ({key}={getattr(cfg, key)}); "
                    "chunked LM-head log-probs do not support final logit softcapping"
                )
        for key in SCALE_KEYS:
            value = getattr(cfg, key, None)
            if value is not None and value != 1.0:
                raise ValueError(
                    f"model type {mtype!r} rescales its logits ({key}={value}); "
                    "chunked LM-head log-probs support only a plain linear LM head"
                )
    prefix = getattr(model, "base_model_prefix", "")
    decoder = getattr(model, prefix, None) if prefix else None
    if not isinstance(decoder, nn.Module) or decoder is model:
        raise ValueError(f"model type {mtype!r} has no base decoder at `{prefix or '?'}`")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"model type {mtype!r} has LM head {type(head).__name__}; expected nn.Linear"
        )
    return decoder, head


def scored_positions(attention_mask: Tensor, action_mask: Tensor | None) -> Tensor:
    """Bool [B, T-1]: True where target token t+1 gets a log-prob (predicted from t)."""
    if action_mask is None:
        return attention_mask[:, 1:] & attention_mask[:, :-1]
    if bool(action_mask[:, 0].any()):
        raise ValueError("action_mask[:, 0] is True: the first token has no context to score")
    if bool((action_mask & ~attention_mask).any()):
        raise ValueError("action_mask is True where attention_mask is False (padding)")
    return action_mask[:, 1:]


def _check_sequence_inputs(
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor | None,
    action_mask: Tensor | None,
) -> None:
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError(f"input_ids must be a long [B, T] tensor, got {describe(input_ids)}")
    if not isinstance(attention_mask, Tensor):
        raise ValueError(f"attention_mask must be a [B, T] tensor, got {describe(attention_mask)}")
    shape = input_ids.shape
    named = {
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "action_mask": action_mask,
    }
    for name, t in named.items():
        if t is None:
            continue
        if not isinstance(t, Tensor) or t.shape != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {describe(t)}")
        if t.device != input_ids.device:
            raise ValueError(f"{name} is on {t.device}, input_ids on {input_ids.device}")
    if action_mask is not None and action_mask.dtype != torch.bool:
        raise ValueError(f"action_mask must be torch.bool, got {action_mask.dtype}")


def sequence_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor | None = None,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = False,
    action_mask: Tensor | None = None,
    pack: bool = False,
    bucket: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Token log-probs (and entropies) of `input_ids` under a HF causal LM, aligned with ids.

    Position t of the `[B, T]` outputs holds `log p(input_ids[t] | input_ids[<t])` (position 0
    holds 0). Only positions with a real context are scored: every non-padding position > 0,
    or, if `action_mask` is given, only its True positions (their hidden states are gathered
    first, so the head runs on policy tokens only). Unscored positions hold 0. `position_ids`
    default to `cumsum(attention_mask) - 1` (right padding). Outputs are float32 (float64 for
    float64 models); log-probs carry gradients into the model, entropies are detached.

    `pack=True` runs the decoder padding-free: the right-padded rows are concatenated into one
    row `[1, sum of lengths]` with their own position ids and boundaries, and the outputs are
    laid out as above. It must run where packed attention is exact: inside
    `frlab.model.packed_attention.packed_attention(model)` (sdpa/eager models; keep the
    backward inside it too) or with flash-attention varlen. `bucket` pads that row with one
    unscored segment to a multiple of `bucket` tokens (few shapes for a compiled decoder).
    """
    decoder, head = lm_parts(model)
    _check_sequence_inputs(input_ids, attention_mask, position_ids, action_mask)
    mask = attention_mask.bool()
    if position_ids is None:
        position_ids = (mask.long().cumsum(dim=1) - 1).clamp_min(0)
    if pack:
        hidden, rows = _packed_hidden(model, decoder, input_ids, mask, position_ids, bucket)
    else:
        with phase("decoder_forward"):
            out = decoder(
                input_ids=input_ids,
                attention_mask=mask.long(),
                position_ids=position_ids,
                use_cache=False,
            )
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        rows = None
    score = scored_positions(mask, action_mask)
    scored_hidden = hidden[:, :-1][score] if rows is None else hidden[rows[:, :-1][score]]
    logp, entropy = logprobs_from_hidden(
        scored_hidden,
        head.weight,
        input_ids[:, 1:][score],
        bias=head.bias,
        temperature=temperature,
        chunk_size=chunk_size,
        compute_entropy=compute_entropy,
    )
    log_probs = _scatter_aligned(logp, score)
    entropies = None if entropy is None else _scatter_aligned(entropy, score)
    return log_probs, entropies


def packed_index(attention_mask: Tensor) -> Tensor:
    """Long [B, T]: position of each real token in the packed row (row-major order); -1 on
    padding. Rows must be right-padded (a prefix of real tokens), else ValueError."""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)
    columns = torch.arange(mask.shape[1], device=mask.device)
    if not torch.equal(mask, columns < lengths[:, None]) or bool((lengths == 0).any()):
        raise ValueError("pack=True needs right-padded rows with at least one real token each")
    flat = mask.flatten().long().cumsum(0).view(mask.shape) - 1
    return torch.where(mask, flat, -1)


def _packed_hidden(
    model: nn.Module,
    decoder: nn.Module,
    input_ids: Tensor,
    mask: Tensor,
    position_ids: Tensor,
    bucket: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Final hidden states `[N, H]` of the packed row (its padding segment included), and
    `packed_index(mask)`."""
    from frlab.model.packed_attention import in_packed_mode

    if not in_packed_mode(model):
        raise ValueError(
            "pack=True outside frlab.model.packed_attention.packed_attention(model): the "
            f"{model.config._attn_implementation!r} attention would attend across trajectories"
        )
    rows = packed_index(mask)
    lengths = mask.sum(dim=1)
    ids, positions = input_ids[mask], position_ids[mask]
    pad = -ids.shape[0] % bucket if bucket else 0
    if pad:  # one more segment, attended by nothing else and never scored
        ids = F.pad(ids, (0, pad))
        positions = torch.cat([positions, torch.arange(pad, device=positions.device)])
        lengths = torch.cat([lengths, lengths.new_tensor([pad])])
    bounds = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    longest = int(lengths.max())
    with phase("decoder_forward"):
        out = decoder(
            input_ids=ids.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            use_cache=False,
            cu_seq_lens_q=bounds,
            cu_seq_lens_k=bounds,
            max_length_q=longest,
            max_length_k=longest,
        )
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return hidden[0], rows


def _scatter_aligned(values: Tensor, score: Tensor) -> Tensor:
    """Place per-scored-token values into [B, T] (column t+1 for score[:, t]); zeros elsewhere."""
    full = values.new_zeros(score.shape).masked_scatter(score, values)
    return F.pad(full, (1, 0))
