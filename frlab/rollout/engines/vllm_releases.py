"""The vLLM releases frlab supports, in one place: error messages, scripts and the README's
compatibility table read `SUPPORTED` (tests keep pyproject.toml's `vllm` extra equal to it).

Adapters never compare version strings: they choose behaviour by what the installed vLLM
offers (a field of `AsyncEngineArgs`, a method of its `WeightSource`), so a release inside the
range that moved an API is handled where the API is used.
"""

from __future__ import annotations

SUPPORTED = "vllm>=0.28,<0.34"  # the `vllm` extra
OLDEST, NEWEST_CPU_BUILD, NEWEST = "0.28.0", "0.32.0", "0.33.0"  # what CI's tiers run against
