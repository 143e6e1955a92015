"""The vLLM releases frlab supports, in one place: error messages, scripts and the
compatibility table of docs/engines.md read `SUPPORTED` (tests keep pyproject.toml's `vllm`
extra equal to it).

Adapters never compare version strings: they choose behaviour by what the installed vLLM
offers (a field of `AsyncEngineArgs`, a method of its `WeightSource`), so a release inside the
range that moved an API is handled where the API is used.
"""

from __future__ import annotations

SUPPORTED = "vllm>=0.28,<0.34"  # the `vllm` extra
OLDEST, NEWEST_CPU_BUILD, NEWEST = "0.28.0", "0.32.0", "0.33.0"  # what CI's tiers run against

# Each release's own torch and transformers requirements, as its wheel's METADATA declares them
# (Requires-Dist): frlab installs beside a release when its core ranges admit both.
RELEASES: dict[str, dict[str, str]] = {
    "0.28.0": {"torch": "==2.13.0", "transformers": ">=5.5.3"},
    "0.29.0": {"torch": "==2.13.0", "transformers": ">=5.10.4"},
    "0.30.0": {"torch": "==2.13.0", "transformers": ">=5.10.4"},
    "0.31.0": {"torch": "==2.13.0", "transformers": ">=5.10.4,<5.18.0"},
    "0.32.0": {"torch": "==2.13.0", "transformers": ">=5.16.1,<5.20.0"},
    "0.33.0": {"torch": "==2.14.0", "transformers": ">=5.16.1,<5.21.0"},
}
