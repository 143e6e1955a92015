"""Config tests: every test leaves Hydra's global state clean."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _clear_hydra():
    yield
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
