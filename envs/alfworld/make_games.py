"""Write small ALFRED-format ALFWorld games offline: `python -m envs.alfworld.make_games OUT_DIR`.

ALFWorld's game files come from `alfworld-download`, which needs the internet. Each game
ALFWorld plays is a folder holding `traj_data.json` (the task type and its PDDL parameters) and
`game.tw-pddl`, a JSON object with the PDDL domain and the TextWorld grammar that the `alfworld`
package ships (`alfworld.info.ALFRED_PDDL_PATH`, `ALFRED_TWL2_PATH`; the task description is
filled into the grammar by `alfworld.agents.utils.misc.add_task_to_grammar`), a PDDL problem and
`"solvable": true`. This script writes one-room `pick_and_place_simple` games: a few
receptacles (one of them openable), a few objects, and the goal "put some X in/on Y". Object
names use ALFRED's mangled form (`Apple|+01.00|+00.90|-00.25` ->
`Apple_bar__plus_01_dot_00_bar__plus_00_dot_90_bar__minus_00_dot_25`), which ALFWorld's
demangler turns into "apple 1". Needs the `alfworld` extra (for the domain and grammar).
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TASK_TYPE = "pick_and_place_simple"
# (receptacle type, openable); the first two are always present so each game has a surface
# and a closed container.
RECEPTACLES = [("CounterTop", False), ("Fridge", True), ("DiningTable", False), ("Cabinet", True)]
OBJECTS = ["Apple", "Mug", "Potato", "Tomato", "Bowl"]
# Type constants the ALFRED domain's actions name (they must be declared by every problem).
DOMAIN_TYPES = {
    "otype": ["ButterKnifeType", "KnifeType"],
    "rtype": ["SinkBasinType", "MicrowaveType", "FridgeType"],
}


@dataclass(frozen=True)
class Thing:
    """A receptacle or object: ALFRED class name, mangled id, PDDL location of its receptacle."""

    kind: str
    name: str
    location: str
    openable: bool = False
    inside: str = ""  # the receptacle an object starts in


@dataclass(frozen=True)
class GameSpec:
    receptacles: tuple[Thing, ...]
    objects: tuple[Thing, ...]
    start: str
    target_object: str
    target_receptacle: str


def mangle(text: str) -> str:
    """ALFRED's PDDL-safe spelling of an id such as `Apple|+01.00|+00.90|-00.25`."""
    for plain, safe in (("|", "_bar_"), ("+", "_plus_"), ("-", "_minus_"), (".", "_dot_")):
        text = text.replace(plain, safe)
    return text


def _coordinate(value: float) -> str:
    text = f"{abs(value):05.2f}"
    return text if value == 0 else ("+" if value > 0 else "-") + text


def object_id(kind: str, rng: random.Random) -> str:
    xyz = [round(rng.uniform(-3, 3), 2) for _ in range(3)]
    return mangle("|".join([kind, *map(_coordinate, xyz)]))


def location_id(rng: random.Random) -> str:
    x, z = rng.randint(-8, 8), rng.randint(-8, 8)
    return mangle(f"loc|{x}|{z}|{rng.randint(0, 3)}|{rng.choice([0, 30, 45, 60])}")


def sample_spec(rng: random.Random) -> GameSpec:
    """One random one-room pick-and-place game whose target object starts elsewhere."""
    kinds = RECEPTACLES[:2] + rng.sample(RECEPTACLES[2:], k=rng.randint(0, 2))
    locations = _distinct(lambda: location_id(rng), len(kinds) + 1)
    receptacles = tuple(
        Thing(kind, object_id(kind, rng), loc, openable)
        for (kind, openable), loc in zip(kinds, locations[1:], strict=True)
    )
    objects = []
    for kind in rng.sample(OBJECTS, k=rng.randint(1, 3)):
        holder = rng.choice(receptacles)
        objects.append(Thing(kind, object_id(kind, rng), holder.location, inside=holder.name))
    target = objects[0]
    goal = rng.choice([r for r in receptacles if r.name != target.inside])
    return GameSpec(receptacles, tuple(objects), locations[0], target.kind, goal.kind)


def _distinct(draw: Any, count: int) -> list[str]:
    values: list[str] = []
    while len(values) < count:
        if (value := draw()) not in values:
            values.append(value)
    return values


def pddl_problem(spec: GameSpec, name: str) -> str:
    """The PDDL problem of `spec` in the ALFRED domain's vocabulary."""
    otypes = sorted({f"{o.kind}Type" for o in spec.objects} | set(DOMAIN_TYPES["otype"]))
    rtypes = sorted({f"{r.kind}Type" for r in spec.receptacles} | set(DOMAIN_TYPES["rtype"]))
    locations = sorted({spec.start} | {r.location for r in spec.receptacles})
    objects = ["agent1 - agent"]
    objects += [f"{t} - otype" for t in otypes] + [f"{t} - rtype" for t in rtypes]
    objects += [f"{o.name} - object" for o in spec.objects]
    objects += [f"{r.name} - receptacle" for r in spec.receptacles]
    objects += [f"{loc} - location" for loc in locations]
    init = [f"(atLocation agent1 {spec.start})"]
    for r in spec.receptacles:
        init += [
            f"(receptacleType {r.name} {r.kind}Type)",
            f"(receptacleAtLocation {r.name} {r.location})",
        ]
        init += [f"(openable {r.name})"] if r.openable else []
    for o in spec.objects:
        init += [f"(objectType {o.name} {o.kind}Type)", f"(pickupable {o.name})"]
        init += [f"(inReceptacle {o.name} {o.inside})", f"(objectAtLocation {o.name} {o.location})"]
    init += [f"(canContain {r} {o})" for r in rtypes for o in otypes]
    goal = (
        "(exists (?r - receptacle) (exists (?o - object) (and "
        f"(objectType ?o {spec.target_object}Type) "
        f"(receptacleType ?r {spec.target_receptacle}Type) (inReceptacle ?o ?r))))"
    )
    lines = [f"(define (problem {name})", "(:domain alfred)", "(:objects"]
    lines += [f"    {o}" for o in objects] + [")", "(:init"] + [f"    {f}" for f in init]
    return "\n".join([*lines, ")", f"(:goal (and {goal}))", ")", ""])


def traj_data(spec: GameSpec, task_id: str) -> dict[str, Any]:
    """The `traj_data.json` fields ALFWorld reads (task type, PDDL params, a task annotation)."""
    desc = f"Put a {spec.target_object.lower()} in the {spec.target_receptacle.lower()}."
    return {
        "task_id": task_id,
        "task_type": TASK_TYPE,
        "pddl_params": {
            "object_target": spec.target_object,
            "parent_target": spec.target_receptacle,
            "toggle_target": "",
            "mrecep_target": "",
            "object_sliced": False,
        },
        "turk_annotations": {"anns": [{"task_desc": desc, "high_descs": []}]},
    }


def game_logic() -> dict[str, str]:
    """The ALFRED PDDL domain and TextWorld grammar shipped with the `alfworld` package."""
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH  # noqa: PLC0415 - extra

    return {
        "pddl_domain": Path(ALFRED_PDDL_PATH).read_text(),
        "grammar": Path(ALFRED_TWL2_PATH).read_text(),
    }


def write_game(folder: Path, spec: GameSpec, logic: dict[str, str], seed: int) -> Path:
    """Write one game folder; return its `game.tw-pddl`."""
    from alfworld.agents.utils.misc import add_task_to_grammar  # noqa: PLC0415 - extra

    folder.mkdir(parents=True, exist_ok=True)
    traj = traj_data(spec, folder.name)
    state = random.getstate()  # the task template is drawn from the global generator
    random.seed(seed)
    try:
        grammar = add_task_to_grammar(logic["grammar"], traj)
    finally:
        random.setstate(state)
    game = {
        "pddl_domain": logic["pddl_domain"],
        "grammar": grammar,
        "pddl_problem": pddl_problem(spec, f"plan_{folder.name}"),
        "solvable": True,
    }
    (folder / "traj_data.json").write_text(json.dumps(traj, indent=1))
    game_file = folder / "game.tw-pddl"
    game_file.write_text(json.dumps(game))
    return game_file


def make_games(out_dir: str | Path, num_games: int = 4, seed: int = 0) -> list[Path]:
    """Write `num_games` games under `out_dir`; return their `game.tw-pddl` paths."""
    if int(num_games) < 1:
        raise ValueError(f"num_games must be >= 1, got {num_games}")
    rng, logic, files = random.Random(seed), game_logic(), []
    for index in range(int(num_games)):
        spec = sample_spec(rng)
        task = f"{TASK_TYPE}-{spec.target_object}-None-{spec.target_receptacle}-{seed}"
        folder = Path(out_dir) / task / f"trial_T{seed:04d}_{index:03d}"
        files.append(write_game(folder, spec, logic, seed * 100003 + index))
    return files


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder to write games into (use it as ALFWORLD_DATA)")
    parser.add_argument("--num-games", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    files = make_games(args.out_dir, args.num_games, args.seed)
    print(f"wrote {len(files)} ALFWorld games under {args.out_dir}")


if __name__ == "__main__":
    main()
