"""Which network interface Gloo should use: the one this host reaches ``MASTER_ADDR`` on.

Gloo binds each rank to the address its hostname resolves to. Where the
hostname resolves to loopback (a common /etc/hosts line, and so on containers
and network namespaces), every rank advertises 127.0.0.1 and ranks on other
hosts cannot connect: a job spanning hosts fails at its first collective. The
interface whose address routes to the rendezvous address is the one peers can
reach. Linux only (``SIOCGIFADDR``); elsewhere, or on any doubt, None.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

#: ioctl number of SIOCGIFADDR (an interface's IPv4 address) on Linux.
_SIOCGIFADDR = 0x8915


def source_address(destination: str) -> str | None:
    """The local IPv4 address packets to ``destination`` leave from (none is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((destination, 9))
            return str(s.getsockname()[0])
    except OSError:
        return None


def interface_addresses() -> dict[str, str]:
    """IPv4 address of each interface that has one."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(
                    s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15])
                )
            except OSError:
                continue
            found[name] = socket.inet_ntoa(packed[20:24])
    return found


def interface_toward(destination: str) -> str | None:
    """The interface to reach ``destination`` on; None if that is loopback or unknown."""
    if not destination:
        return None
    try:
        destination = socket.gethostbyname(destination)
    except OSError:
        return None
    local = source_address(destination)
    if local is None or ipaddress.ip_address(local).is_loopback:
        return None
    try:
        addresses = interface_addresses()
    except OSError:
        return None
    return next((name for name, addr in addresses.items() if addr == local), None)
