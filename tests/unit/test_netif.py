"""Gloo's interface choice: toward MASTER_ADDR, never loopback."""

from __future__ import annotations

import pytest

from hetero.trainer.netif import interface_addresses, interface_toward, source_address


def test_loopback_and_empty_rendezvous_leave_gloo_alone() -> None:
    assert interface_toward("127.0.0.1") is None
    assert interface_toward("localhost") is None
    assert interface_toward("") is None
    assert interface_toward("no-such-host.invalid") is None


def test_a_routable_rendezvous_picks_the_interface_holding_the_source_address() -> None:
    addresses = {name: a for name, a in interface_addresses().items() if not a.startswith("127.")}
    if not addresses:
        pytest.skip("this host has no non-loopback IPv4 interface")
    name, address = sorted(addresses.items())[0]
    # This host's own address routes through the interface that holds it.
    assert source_address(address) == address
    assert interface_toward(address) == name
