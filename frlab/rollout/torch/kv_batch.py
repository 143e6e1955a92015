"""The torch engine's running batch: rows that decode together over one KV cache.

Rows are left-padded: every row's newest position is the last column, so one decode step
feeds one token per row. New requests are prefilled on their own and then MERGED into the
running batch (both caches left-padded to the wider one), finished rows are removed, and
leading columns that are padding for every remaining row are dropped. Padding columns carry
attention mask 0 and zero keys/values.

A prefill may also run the prompts packed end to end in one row (frlab.rollout.torch.prefill);
`unpack_rows` then splits its cache into the same left-padded rows.

`GrowingLayer` keeps a layer's keys and values at the front of a buffer with spare room on the
time axis, so a decode step writes one column in place; transformers' `DynamicLayer`
concatenates, which copies the whole cache at every step.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

GROWTH_MIN = 64  # columns added at least when a buffer grows


class GrowingLayer(DynamicLayer):
    """One layer's cache: `keys`/`values` are views `[b, heads, length, dim]` of larger buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.length = 0
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `[b, heads, n, dim]` states at the end; return all cached states."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        self._reserve(end, key_states, value_states)
        assert self._kbuf is not None and self._vbuf is not None
        self._kbuf[:, :, start:end].copy_(key_states)
        self._vbuf[:, :, start:end].copy_(value_states)
        self.set(self._kbuf, self._vbuf, end)
        return self.keys, self.values

    def _reserve(self, needed: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Make the buffers hold at least `needed` columns (grow by half, at least GROWTH_MIN)."""
        capacity = 0 if self._kbuf is None else self._kbuf.shape[2]
        if needed <= capacity:
            return
        capacity = max(needed, capacity + max(GROWTH_MIN, capacity // 2))
        kbuf = keys.new_empty((*keys.shape[:2], capacity, keys.shape[3]))
        vbuf = values.new_empty((*values.shape[:2], capacity, values.shape[3]))
        if self.length:
            kbuf[:, :, : self.length].copy_(self.keys)
            vbuf[:, :, : self.length].copy_(self.values)
        self._kbuf, self._vbuf = kbuf, vbuf

    def set(self, kbuf: torch.Tensor, vbuf: torch.Tensor, length: int) -> None:
        """Use `kbuf`/`vbuf` as buffers whose first `length` columns are the cache."""
        self._kbuf, self._vbuf, self.length = kbuf, vbuf, int(length)
        self.keys, self.values = kbuf[:, :, :length], vbuf[:, :, :length]
        self.is_initialized = True

    def get_seq_length(self, *args: object) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows `indices` (a copy of those rows' buffers)."""
        if self._kbuf is not None:
            self.set(self._kbuf[indices], self._vbuf[indices], self.length)  # type: ignore[index]

    def drop_left(self, n: int) -> None:
        """Forget the first `n` columns (a view: no copy)."""
        if n > 0 and self._kbuf is not None:
            assert self._vbuf is not None
            self.set(self._kbuf[:, :, n:], self._vbuf[:, :, n:], self.length - n)


class GrowingCache(DynamicCache):
    """A DynamicCache whose layers are `GrowingLayer`s (created on first use, or given)."""

    def __init__(self, layers: list[GrowingLayer] | None = None) -> None:
        super().__init__()
        self.layer_class_to_replicate = GrowingLayer
        if layers:
            self.layers = list(layers)

    def growing_layers(self) -> list[GrowingLayer]:
        """The layers, checked to be GrowingLayers (a model that made its own cannot merge)."""
        if not all(isinstance(layer, GrowingLayer) for layer in self.layers):
            kinds = sorted({type(layer).__name__ for layer in self.layers})
            raise TypeError(f"the model replaced the engine's cache layers with {kinds}")
        return list(self.layers)  # type: ignore[arg-type]


def right_aligned(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> GrowingLayer:
    """A layer of the rows of `parts` in order (each a (keys, values) pair `[rows, heads,
    length, dim]`), every part's columns ending at the widest one's end, zeros before."""
    width = max(keys.shape[2] for keys, _ in parts)
    keys0, values0 = parts[0]
    rows = sum(keys.shape[0] for keys, _ in parts)
    kbuf = keys0.new_zeros((rows, keys0.shape[1], width + GROWTH_MIN, keys0.shape[3]))
    vbuf = values0.new_zeros((rows, values0.shape[1], width + GROWTH_MIN, values0.shape[3]))
    row = 0
    for keys, values in parts:
        end, n = row + keys.shape[0], keys.shape[2]
        kbuf[row:end, :, width - n : width].copy_(keys)
        vbuf[row:end, :, width - n : width].copy_(values)
        row = end
    out = GrowingLayer()
    out.lazy_initialization(keys0, values0)
    out.set(kbuf, vbuf, width)
    return out


def merge_layers(a: GrowingLayer, b: GrowingLayer) -> GrowingLayer:
    """Rows of `a` then rows of `b`, both left-padded (zeros) to the wider one."""
    return right_aligned([(a.keys, a.values), (b.keys, b.values)])


def unpack_layer(packed: GrowingLayer, lengths: list[int]) -> GrowingLayer:
    """Split a layer prefilled from ONE packed row (`[1, heads, sum(lengths), dim]`, prompts end
    to end) into one row per prompt, left-padded (zeros) to the longest."""
    starts = itertools.accumulate([0, *lengths[:-1]])
    keys, values = packed.keys, packed.values
    return right_aligned(
        [
            (keys[:, :, s : s + n], values[:, :, s : s + n])
            for s, n in zip(starts, lengths, strict=True)
        ]
    )


def unpack_rows(cache: GrowingCache, lengths: list[int]) -> tuple[GrowingCache, torch.Tensor]:
    """The left-padded cache of a packed prefill, and its attention mask [n, max(lengths)]."""
    layers = [unpack_layer(layer, lengths) for layer in cache.growing_layers()]
    device = layers[0].keys.device if layers else torch.device("cpu")
    return GrowingCache(layers), left_mask(lengths).to(device)


@dataclass
class DecodeRows:
    """Rows decoding together: their cache, which cached columns are real (`attention` [b, L],
    1 = a real token), the position id of the token fed next (`positions` [b]) and that token,
    the last one sampled (`tokens` [b])."""

    cache: GrowingCache
    attention: torch.Tensor
    positions: torch.Tensor
    tokens: torch.Tensor

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def select(self, rows: list[int]) -> None:
        """Keep `rows` (in this order); drop leading columns that are padding in all of them."""
        index = torch.tensor(rows, device=self.tokens.device, dtype=torch.long)
        self.cache.batch_select_indices(index)
        self.attention, self.positions = self.attention[index], self.positions[index]
        self.tokens = self.tokens[index]
        real = self.attention.any(dim=0)
        lead = int(real.int().argmax()) if bool(real.any()) else 0
        if lead:
            for layer in self.cache.growing_layers():
                layer.drop_left(lead)
            self.attention = self.attention[:, lead:]

    def merge(self, other: DecodeRows) -> DecodeRows:
        """A batch of this one's rows, then `other`'s (left-padded to the same width)."""
        mine, theirs = self.cache.growing_layers(), other.cache.growing_layers()
        if len(mine) != len(theirs):
            raise RuntimeError(f"cannot merge caches of {len(mine)} and {len(theirs)} layers")
        layers = [merge_layers(a, b) for a, b in zip(mine, theirs, strict=True)]
        width = layers[0].length if layers else 0
        return DecodeRows(
            GrowingCache(layers),
            torch.cat([_left_fill(self.attention, width), _left_fill(other.attention, width)]),
            torch.cat([self.positions, other.positions]),
            torch.cat([self.tokens, other.tokens]),
        )


def _left_fill(attention: torch.Tensor, width: int) -> torch.Tensor:
    """`attention` [b, L] left-padded with zeros to [b, width]."""
    pad = width - attention.shape[1]
    if pad <= 0:
        return attention
    return torch.cat([attention.new_zeros((attention.shape[0], pad)), attention], dim=1)


def left_mask(lengths: list[int]) -> torch.Tensor:
    """Attention mask [n, max(lengths)] (long): 1 on the last `lengths[i]` columns of row i."""
    width = max(lengths)
    return (torch.arange(width) >= width - torch.tensor(lengths).unsqueeze(1)).long()


def left_pad(prompts: list[list[int]], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Left-padded ids, attention mask and position ids (0 at each row's first real token)."""
    attention = left_mask([len(p) for p in prompts])
    ids = torch.zeros(attention.shape, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, attention.shape[1] - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
    positions = (attention.cumsum(dim=1) - 1).clamp_min(0)
    return ids.to(device), attention.to(device), positions.to(device)
