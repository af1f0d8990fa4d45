"""The rendezvous store listens on ``MASTER_ADDR`` alone (issue 33): on a one-host job
another local user cannot reach it through an address other than the loopback, and
another host cannot reach it at all."""

from __future__ import annotations

import ipaddress
import sys

import pytest

from hetero.trainer.procgroup import _listen

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads listening sockets from /proc/net"
)


def test_a_one_host_jobs_store_listens_on_the_loopback_only(run_ranks) -> None:
    run_ranks("rendezvous.py", 2)


def test_a_name_that_is_loopback_here_listens_everywhere_only_for_a_multi_host_job() -> None:
    """``MASTER_ADDR`` a hostname that resolves to ``127.0.1.1`` here but to the node's
    address elsewhere: binding the loopback would lock the other hosts out."""
    one_host = _listen("localhost", 0, one_host=True)
    spread = _listen("localhost", 0, one_host=False)
    try:
        assert ipaddress.ip_address(one_host.getsockname()[0]).is_loopback
        assert spread.getsockname()[0] in ("::", "0.0.0.0")
    finally:
        one_host.close()
        spread.close()


def test_an_address_of_another_host_falls_back_to_every_interface() -> None:
    """``MASTER_ADDR`` an address this host cannot listen on (a NAT's): the job still
    starts, listening as torch would, rather than failing."""
    elsewhere = _listen("192.0.2.1", 0, one_host=False)  # TEST-NET-1: no host's own
    try:
        assert elsewhere.getsockname()[0] in ("::", "0.0.0.0")
    finally:
        elsewhere.close()
