"""The remote rollout backend, an HTTP client of a fleet of generation servers (`vllm serve` with
frlab's worker extension, or `python -m frlab.serve`), one module each:

- `engine`: `RemoteEngine` (`rollout/engine=remote`): least-loaded dispatch, failover and
  re-admission of servers; `fleet`: the servers' states, HTTP and control calls; `traffic`:
  its own requests' gate and in-flight count;
- `protocol`, `control`: the wire format of requests, answers and control calls (frlab.serve
  answers the same); `generate`: vLLM's token-in/token-out endpoint and version labels;
- `weight_sync`: snapshots or NCCL pushed to every server, the version check, admission;
  `nccl`: the NCCL group with the fleet; `lora`: adapters loaded by name on vLLM servers;
  `in_flight`, `resubmit`: what an update does to the requests in flight; `hosts`: the
  address the servers reach the learner at.

It imports frlab.rollout.vllm (the worker extension's methods, snapshots, adapter folders, the
sampling fields and NCCL API vLLM takes); nothing outside it imports it but the remote engine's
config (`rollout/engine=remote`, whose class preflight asks) and frlab.serve (the wire format
it answers). Importing this package imports none of its modules.
"""
