"""Rollout engines, one module each: `torch` (TorchEngine, CPU/CUDA) and `vllm` (VLLMEngine, GPU,
imported lazily so that `import frlab` never imports vllm). The remote fleet engine lives in
`frlab.rollout.remote`. All implement `frlab.rollout.engine.Engine`."""
