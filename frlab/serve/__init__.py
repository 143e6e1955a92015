"""`python -m frlab.serve`: a rollout server speaking the vLLM protocol subset the `remote`
backend uses, over frlab's torch engine (CPU or GPU).

It is a TEST AND CPU VEHICLE, NOT A REPLACEMENT FOR vLLM: it exists so that multi-server
pools, weight sync and failover run, and are tested, with real processes on loopback where
vLLM cannot run. On GPUs, serve with `vllm serve` (see docs/engines.md: fleets). Protocol:
`frlab.rollout.remote.protocol`; server: `frlab.serve.server`; CLI: `frlab.serve.__main__`.
"""
