"""`collate`: ragged trajectories right-padded into one `RolloutBatch`, row by row exact."""

from __future__ import annotations

import random

import pytest
import torch

from frlab.data.batch import Trajectory, collate


def ragged(seed: int, n: int) -> list[Trajectory]:
    """Trajectories of lengths 2..12 with a prompt, interleaved action/observation tokens."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(2, 12)
        mask = [False] + [rng.random() < 0.7 for _ in range(length - 1)]
        mask[-1] = True
        out.append(
            Trajectory(
                token_ids=[rng.randrange(1, 50) for _ in range(length)],
                action_mask=mask,
                behavior_log_probs=[-rng.random() * 3 if a else 0.0 for a in mask],
                token_versions=[rng.randrange(0, 4) if a else -1 for a in mask],
                reward=rng.random(),
                prompt_id=100 + i,
                failure=i % 3 == 0,
                truncated=i % 4 == 1,
            )
        )
    return out


def by_hand(trajs: list[Trajectory], pad: int) -> dict[str, torch.Tensor]:
    """The padded fields built one row at a time (the obvious loop)."""
    width = max(len(t.token_ids) for t in trajs)
    rows: dict[str, list[list]] = {
        "input_ids": [],
        "attention_mask": [],
        "action_mask": [],
        "behavior_log_probs": [],
        "token_versions": [],
    }
    for t in trajs:
        gap = width - len(t.token_ids)
        rows["input_ids"].append(t.token_ids + [pad] * gap)
        rows["attention_mask"].append([True] * len(t.token_ids) + [False] * gap)
        rows["action_mask"].append(t.action_mask + [False] * gap)
        rows["behavior_log_probs"].append(t.behavior_log_probs + [0.0] * gap)
        rows["token_versions"].append(t.token_versions + [-1] * gap)
    dtypes = {
        "input_ids": torch.long,
        "attention_mask": torch.bool,
        "action_mask": torch.bool,
        "behavior_log_probs": torch.float32,
        "token_versions": torch.long,
    }
    return {k: torch.tensor(v, dtype=dtypes[k]) for k, v in rows.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_collate_equals_the_row_by_row_padding(seed: int) -> None:
    trajs = ragged(seed, 9)
    batch = collate(trajs, pad_token_id=7)
    for name, expected in by_hand(trajs, 7).items():
        got = getattr(batch, name)
        assert got.dtype == expected.dtype, name
        assert torch.equal(got, expected), name
    lengths = torch.tensor([len(t.token_ids) for t in trajs])
    positions = torch.arange(int(lengths.max())).expand(len(trajs), -1)
    assert torch.equal(batch.position_ids, torch.minimum(positions, (lengths - 1).unsqueeze(1)))
    assert torch.equal(batch.rewards, torch.tensor([t.reward for t in trajs], dtype=torch.float32))
    assert batch.failures.tolist() == [t.failure for t in trajs]
    assert batch.truncated.tolist() == [t.truncated for t in trajs]
    assert batch.prompt_ids.tolist() == [t.prompt_id for t in trajs]
    assert batch.routing is None


def test_collate_of_one_full_width_row_has_no_padding() -> None:
    (traj,) = ragged(5, 1)
    batch = collate([traj])
    assert batch.input_ids.tolist() == [traj.token_ids]
    assert bool(batch.attention_mask.all())


def test_collate_refuses_an_empty_list() -> None:
    with pytest.raises(ValueError, match="at least one trajectory"):
        collate([])


def test_the_per_rank_batch_is_whole_or_refused_naming_the_key() -> None:
    """One rule for preflight, the data module and the learner: B splits evenly over ranks."""
    import pytest

    from frlab.data.batch import per_rank_batch

    assert per_rank_batch(64, 4) == 16 and per_rank_batch(7, 1) == 7
    for b, world in ((64, 3), (4, 0)):
        with pytest.raises(ValueError, match=r"data\.batch_size`: \(\d+\) must be divisible"):
            per_rank_batch(b, world)
