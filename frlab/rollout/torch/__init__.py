"""The torch rollout engine, in-process and in a child process, one module each:

- `engine`: `TorchEngine` (`rollout/engine=torch`), continuous-batching KV-cache sampling in a
  thread of the learner's process, on CPU or CUDA;
- `process`: `ProcessTorchEngine` (`rollout/engine=torch_process`), the same sampler in a
  spawned child over shared-memory weights (CPU); `child` is the child's side, `shared_weights`
  the limits sharing the weights meets;
- `steps`, `prefill`, `kv_batch`: the forward steps, the prefill plan (packed or left-padded)
  and the batched KV cache; `sampling`: the draw and its log-probs; `request_state`: one
  request's record; `common`: the checks both engines share.

Nothing here imports vllm or the remote fleet client; importing this package imports none of
its modules.
"""
