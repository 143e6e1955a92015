"""The torch engine's two kinds of forward step (frlab.rollout.torch.engine): the prefill of
newly admitted requests, each group of the prefill plan (frlab.rollout.torch.prefill)
left-padded or packed in one row and its cache turned into decoding rows, and one decode step
of every running row. A request's context is its prompt, then the tokens it has sampled so far
(a request re-prefilled after a `resubmit` weight update)."""

from __future__ import annotations

from typing import Any

import torch

from frlab.rollout.torch import prefill
from frlab.rollout.torch.kv_batch import DecodeRows, GrowingCache, left_pad, unpack_rows
from frlab.rollout.torch.request_state import Request, drop_finished


def prefill_requests(engine: Any, reqs: list[Request]) -> tuple[DecodeRows | None, list[Request]]:
    """Prefill `reqs` (in order) as the prefill plan groups them: packed or left-padded."""
    rows, kept = None, []
    for group, packed in prefill.plan([len(r.context) for r in reqs], engine._prefill_cost):
        part = [reqs[i] for i in group]
        fresh, part = _packed(engine, part) if packed else _padded(engine, part)
        if fresh is not None:
            rows = fresh if rows is None else rows.merge(fresh)
            kept += part
    return rows, kept


def _padded(engine: Any, reqs: list[Request]) -> tuple[DecodeRows | None, list[Request]]:
    ids, attention, positions = left_pad([r.context for r in reqs], engine.device)
    cache, width = GrowingCache(), ids.shape[1]
    spans = [(row, width - len(r.context), width) for row, r in enumerate(reqs)]
    logits = engine._forward(ids, attention, positions, cache, reqs, spans)
    rows = DecodeRows(cache, attention, positions[:, -1] + 1, engine._sample(logits, reqs))
    return drop_finished(rows, reqs)


def _packed(engine: Any, reqs: list[Request]) -> tuple[DecodeRows | None, list[Request]]:
    lengths = [len(r.context) for r in reqs]
    ids, positions, last = prefill.packed_inputs([r.context for r in reqs], engine.device)
    mask, cache = prefill.packed_mask(engine._model, positions), GrowingCache()
    spans = [(0, end + 1 - n, end + 1) for n, end in zip(lengths, last.tolist(), strict=True)]
    logits = engine._forward(ids, mask, positions, cache, reqs, spans, keep=last)
    cache, attention = unpack_rows(cache, lengths)
    next_positions = torch.tensor(lengths, device=engine.device)
    rows = DecodeRows(cache, attention, next_positions, engine._sample(logits, reqs))
    return drop_finished(rows, reqs)


def decode_step(
    engine: Any, rows: DecodeRows, reqs: list[Request]
) -> tuple[DecodeRows | None, list[Request]]:
    """One decode step: every row's last token through the shared cache, one sample each."""
    attention = torch.cat([rows.attention, rows.attention.new_ones((len(rows), 1))], dim=1)
    tokens, positions = rows.tokens.unsqueeze(1), rows.positions.unsqueeze(1)
    logits = engine._forward(tokens, attention, positions, rows.cache, reqs)
    rows.attention, rows.positions = attention, rows.positions + 1
    rows.tokens = engine._sample(logits, reqs)
    return drop_finished(rows, reqs)
