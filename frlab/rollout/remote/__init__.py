"""The remote rollout fleet: `RemoteEngine` (least-loaded dispatch, failover, re-admission) over
N generation servers (`vllm serve` with frlab's worker extension, or `python -m frlab.serve`),
the wire protocol, versioned weight snapshots, NCCL weight transfer and the multi-rank fleet
sync. Imported lazily: nothing here is loaded unless `rollout.engine=remote` is chosen."""
