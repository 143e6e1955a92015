"""The `vllm_contract` tier: vLLM's own code (the pinned wheel, installed without its CUDA
dependencies by scripts/vllm_contract_env.sh) drives frlab's adapters on a CPU. vLLM picks
its platform once; without a GPU it must be told it runs on the CPU platform, or its configs
refuse an empty device type."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_SERVER_DEV_MODE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
