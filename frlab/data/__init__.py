"""Data contracts between the rollout side and the learner."""

from frlab.data.batch import RolloutBatch, Trajectory, TrajectoryError, collate

__all__ = ["RolloutBatch", "Trajectory", "TrajectoryError", "collate"]
