"""Shared by the Python-tool sandbox tests: `needs_namespace` marks a hostile test that relies on
namespaces; it skips in plain mode (not root / no unshare), whose limits the sandbox docstring
states."""

from __future__ import annotations

import pytest

from envs.python_tool import sandbox_mode

needs_namespace = pytest.mark.skipif(
    sandbox_mode() != "namespace", reason="namespace sandbox needs root and util-linux unshare"
)
