"""Where the NCCL rendezvous of `rollout.remote.weight_sync=nccl` listens (stdlib only, so that
preflight can use it).

The learner is NCCL rank 0 and every server connects to its address. A host name resolved by
`gethostbyname(gethostname())` is no such address: on Debian-style hosts it resolves to the
loopback alias 127.0.1.1, which servers on other machines cannot reach, and a wrong address
hangs the group's formation. So the address is explicit: loopback when every server listed
is on this host's loopback, else `rollout.remote.nccl_master_address` must name it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from frlab.errors import ConfigError

LOOPBACK = "127.0.0.1"


def is_loopback_url(url: str) -> bool:
    """True when the server at `url` is on this host's loopback (`localhost`, 127/8, ::1)."""
    host = urlsplit(str(url)).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may be another machine
        return False


def nccl_master_address(address: str | None, servers: Sequence[str]) -> str:
    """The address the servers reach the learner at: `address` when given, loopback when
    every server is on loopback; ValueError naming `rollout.remote.nccl_master_address`
    otherwise."""
    if address:
        return str(address)
    remote = [u for u in servers if not is_loopback_url(u)]
    if remote:
        raise ConfigError(
            "rollout.remote.nccl_master_address",
            "must be set (an address of this learner host "
            f"that the servers can reach) when servers run on other hosts: {remote}; this "
            "host's name may resolve to a loopback alias they cannot reach",
        )
    return LOOPBACK
