"""Tensor helpers shared by the model and the objective (chunked sampled-token log-probs and
entropies), below both in the import graph: `frlab.ops` imports neither."""

from frlab.ops.logprobs import sampled_logprobs_and_entropy

__all__ = ["sampled_logprobs_and_entropy"]
