"""Everything of frlab that knows vLLM's Python API, one module each:

- `engine`: `VLLMEngine` (`rollout/engine=vllm`), vLLM's asynchronous engine in-process;
- `args`: the keywords frlab gives vLLM's `SamplingParams` and `AsyncEngineArgs`, the check of
  the served log-prob mode, this rank's GPU; `platform`: what the installed vLLM offers (its
  platform, CPU attention sizes, token version labels) and a CPU engine's options;
  `outputs`: the log-probs, finish reason and token versions of a vLLM completion;
- `weights`: the in-process engine's weight updates; `snapshot`: the safetensors snapshots a
  worker loads; `lora`: the adapter folders vLLM's LoRA support loads;
- `worker_extension`: the class vLLM mixes into its workers (`--worker-extension-cls
  frlab.rollout.vllm.worker_extension.WeightUpdateExtension`), loading weights by method name;
- `nccl`: vLLM's trainer-side NCCL weight-transfer API and the weight source it sends from;
- `releases`: the vLLM releases frlab supports.

vllm itself is imported only inside functions that run when a vLLM engine starts or a vLLM
API is asked for (`import frlab` never imports it). The remote fleet client
(frlab.rollout.remote) imports modules of this package; nothing here imports it. Importing
this package imports none of its modules: a vLLM worker that loads the worker extension loads
that module (and what it imports) only.
"""
