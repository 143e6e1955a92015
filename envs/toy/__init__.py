"""Toy environments that a tiny random-init policy learns in minutes on CPU.

`toy_single` (ParityEnv): one turn, is the last digit shown odd (1) or even (0)?
`toy_multi` (KeyParityEnv): two turns, the parity of a key revealed only by an observation.
`toy_faulty` (FaultyParityEnv): the single-turn task with injected hangs, exceptions and string
rewards, for trying out the failure behaviour (not a learning task: not in TOY_ENVS).
"""

from envs.toy.faulty import FaultyParityEnv
from envs.toy.multi import KeyParityEnv, KeyParityTasks
from envs.toy.single import ParityEnv, ParityTasks

TOY_ENVS = {"toy_single": ParityEnv, "toy_multi": KeyParityEnv}

__all__ = [
    "TOY_ENVS",
    "FaultyParityEnv",
    "KeyParityEnv",
    "KeyParityTasks",
    "ParityEnv",
    "ParityTasks",
]
