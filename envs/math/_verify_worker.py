"""A math-verify worker process: reads JSON requests on stdin, writes JSON replies on stdout.

Started by `envs.math.symbolic` with `python _verify_worker.py MEMORY_MB`. It runs in its own
main thread, so math-verify's `signal.alarm` timeouts work here; the parent adds a hard
deadline and kills the process when a request outlives it (a signal cannot interrupt a long
C-level computation such as a huge integer power).

Protocol, one JSON object per line: first the worker writes {"ready": bool, "error": str|None};
then for each request {"gold": str, "pred": str, "timeout": int} it writes
{"equal": bool, "error": str|None}. Stray prints of the libraries go to /dev/null.
Only the standard library and math-verify are imported (no frlab, no torch).
"""

from __future__ import annotations

import json
import logging
import os
import sys


def _limit_resources(memory_mb: int) -> None:
    """Cap the address space and die with the parent where the platform allows."""
    try:
        import resource

        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass
    try:  # Linux: SIGKILL this worker when its parent dies (PR_SET_PDEATHSIG = 1)
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _equal(verify_api: tuple, gold: str, pred: str, timeout: int) -> bool:
    """math-verify's verdict on `pred` against `gold`, both read as LaTeX inside `$...$`."""
    parse, verify = verify_api
    gold_parsed = parse(f"${gold}$", parsing_timeout=timeout)
    pred_parsed = parse(f"${pred}$", parsing_timeout=timeout)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))


def _serve(reply: object, verify_api: tuple) -> None:
    """Answer requests until stdin closes."""
    for line in sys.stdin:
        try:
            request = json.loads(line)
            equal = _equal(verify_api, request["gold"], request["pred"], int(request["timeout"]))
            answer = {"equal": equal, "error": None}
        except BaseException as exc:  # noqa: BLE001 - MemoryError, TimeoutException, ...
            answer = {"equal": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        reply.write(json.dumps(answer) + "\n")
        reply.flush()


def main() -> None:
    memory_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    logging.disable(logging.CRITICAL)
    _limit_resources(memory_mb)
    try:
        from math_verify import parse, verify
    except ImportError as exc:
        reply.write(json.dumps({"ready": False, "error": repr(exc)}) + "\n")
        return
    reply.write(json.dumps({"ready": True, "error": None}) + "\n")
    reply.flush()
    _serve(reply, (parse, verify))


if __name__ == "__main__":
    main()
