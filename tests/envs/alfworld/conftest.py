"""A fixed one-room ALFRED game for the ALFWorld tests (skips without the alfworld extra)."""

from __future__ import annotations

import pytest

_WINNING_ACTIONS = [
    "go to countertop 1",
    "take apple 1 from countertop 1",
    "go to diningtable 1",
    "move apple 1 to diningtable 1",
]


@pytest.fixture
def winning_actions() -> list[str]:
    """A known winning action sequence for `fixed_game`."""
    return list(_WINNING_ACTIONS)


@pytest.fixture(scope="session")
def fixed_game(tmp_path_factory) -> str:
    """Apple on the counter; the task: put it on the dining table (a closed fridge stands by)."""
    pytest.importorskip(
        "alfworld.info", reason="needs the alfworld extra (pip install frlab[alfworld])"
    )
    from envs.alfworld.make_games import GameSpec, Thing, game_logic, mangle, write_game

    counter = mangle("CounterTop|+01.00|+00.95|-01.00")
    spec = GameSpec(
        receptacles=(
            Thing("CounterTop", counter, mangle("loc|4|-3|1|45")),
            Thing("Fridge", mangle("Fridge|-02.10|00.00|+01.07"), mangle("loc|-5|2|3|0"), True),
            Thing(
                "DiningTable", mangle("DiningTable|-02.00|+00.75|+01.50"), mangle("loc|-6|5|3|45")
            ),
        ),
        objects=(
            Thing(
                "Apple",
                mangle("Apple|+01.00|+00.90|-00.25"),
                mangle("loc|4|-3|1|45"),
                inside=counter,
            ),
        ),
        start=mangle("loc|0|0|0|30"),
        target_object="Apple",
        target_receptacle="DiningTable",
    )
    folder = tmp_path_factory.mktemp("alfworld") / "pick_and_place_simple-Apple-None-DiningTable-1"
    return str(write_game(folder / "trial_0", spec, game_logic(), seed=0))
