"""Make this folder's worker scripts (ddp_worker, fsdp_worker) importable whatever pytest's
import mode."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
