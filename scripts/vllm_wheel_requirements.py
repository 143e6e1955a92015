"""Print the pip requirements a vLLM wheel declares, minus the ones a CPU test venv must not take.

    python scripts/vllm_wheel_requirements.py WHEEL [--drop NAME ...]

Reads the wheel's own METADATA (`Requires-Dist`), drops optional extras and the packages
named by `--drop` (always: torch, torchaudio, torchvision, torchcodec, which frlab installs as
the local CPU wheel or does not need for text models), and prints one requirement per line,
environment markers kept, so that `pip install -r` resolves exactly what that release asks
for. Used by scripts/vllm_cpu_env.sh and scripts/vllm_contract_env.sh: each release's
requirements come from the release itself, never from a hand-kept list.
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from email.parser import Parser

ALWAYS_DROPPED = ("torch", "torchaudio", "torchvision", "torchcodec")


def _name(requirement: str) -> str:
    """The normalised distribution name at the start of a requirement string."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def wheel_requirements(wheel: str, drop: tuple[str, ...] = ()) -> list[str]:
    """`Requires-Dist` entries of `wheel` that are not extras and not in `drop`."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise ValueError(f"{wheel}: expected one .dist-info/METADATA, found {names}")
        metadata = Parser().parsestr(zf.read(names[0]).decode())
    dropped = {_name(n) for n in (*ALWAYS_DROPPED, *drop)}
    out = []
    for requirement in metadata.get_all("Requires-Dist") or []:
        marker = requirement.split(";", 1)[1] if ";" in requirement else ""
        if re.search(r"\bextra\s*==", marker) or _name(requirement) in dropped:
            continue
        out.append(requirement.strip())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel")
    parser.add_argument("--drop", action="append", default=[], help="also drop this package")
    args = parser.parse_args(argv)
    for line in wheel_requirements(args.wheel, tuple(args.drop)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
