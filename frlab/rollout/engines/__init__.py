"""The vLLM engine in-process (`vllm`, VLLMEngine, imported lazily so that `import frlab` never
imports vllm). The torch engines live in `frlab.rollout.torch`, the remote fleet engine in
`frlab.rollout.remote`. All implement `frlab.rollout.engine.Engine`."""
