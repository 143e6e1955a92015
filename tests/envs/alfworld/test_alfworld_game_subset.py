"""`env.num_games`: a fixed, reproducible subset of the training games (the reference trains on
1,024 ALFWorld games). Only folder listing is exercised: no game is played."""

from __future__ import annotations

from pathlib import Path

import pytest

from envs.alfworld.env import GAME_FILE, TRAJ_FILE, AlfworldEnv


def _games(root: Path, n: int) -> Path:
    for i in range(n):
        folder = root / f"task_{i:03d}" / "trial"
        folder.mkdir(parents=True)
        (folder / GAME_FILE).write_text("{}")
        (folder / TRAJ_FILE).write_text("{}")
    return root


def test_num_games_draws_a_seeded_subset(tmp_path: Path) -> None:
    root = _games(tmp_path / "train", 30)
    every = AlfworldEnv(data_dir=str(root)).games()
    assert len(every) == 30
    subset = AlfworldEnv(data_dir=str(root), num_games=10).games()
    assert len(set(subset)) == 10 and set(subset) <= set(every) and subset == sorted(subset)
    assert subset != every[:10]  # drawn from the whole split, not its first folders
    assert AlfworldEnv(data_dir=str(root), num_games=10).games() == subset  # reproducible
    other = AlfworldEnv(data_dir=str(root), num_games=10, games_seed=1).games()
    assert other != subset
    assert AlfworldEnv(data_dir=str(root), num_games=30).games() == every


def test_bad_num_games_name_the_key(tmp_path: Path) -> None:
    root = _games(tmp_path / "train", 3)
    with pytest.raises(ValueError, match="env.num_games=4 but"):
        AlfworldEnv(data_dir=str(root), num_games=4).games()
    with pytest.raises(ValueError, match="env.num_games"):
        AlfworldEnv(data_dir=str(root), num_games=0)
