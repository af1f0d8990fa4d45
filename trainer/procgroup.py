"""Joining and leaving the torch.distributed process group, so that leaving ends it.

``destroy_process_group()`` only drops c10d's own references to the group. The
Gloo backend, with its two worker threads, its TCP transport loop and (on rank 0)
the TCPStore server thread, is destroyed and its threads joined when the *last*
reference goes. Anything that still holds the group keeps those threads running
into interpreter finalization, and there they can kill a finished rank:

A Gloo worker drops its reference to a collective only after completing it, when
it next gets a CPU; the caller may have moved on long before. If the collective's
Python tensors are gone by then, the worker owns their Python objects, and freeing
them needs the GIL. CPython ends any thread that asks for the GIL while the
interpreter finalizes (``pthread_exit``); the unwinding crosses the work's
``noexcept`` destructor, so ``std::terminate`` aborts the process: "terminate
called without an active exception", exit status 134, after the job wrote its
results. Rare, and likelier on a loaded machine, where the worker waits longest
for a CPU. The native stack of that abort (torch 2.14.1, CPython 3.11)::

    std::terminate <- _Unwind_ForcedUnwind <- pthread_exit <- PyThread_exit_thread
    <- take_gil <- THPVariable_dealloc <- TensorImpl::decref_pyobject
    <- ~AsyncAllgatherWork <- ProcessGroupGloo::runLoop      (thread pt_gloo_runloop)

Three things held the group past ``destroy_process_group()``; avoid them, and the
group's destructor joins its workers inside ``destroy_process_group()`` (or when the
last holder goes), while the interpreter is whole:

- ``torch/distributed/nn/functional.py`` binds ``group=group.WORLD`` as default
  arguments when it is first imported. ``DistributedDataParallel``'s constructor
  imports it (through ``torch._dynamo``), so after ``init_process_group`` ten
  module-level functions hold the default group until the interpreter exits.
  :func:`join` imports that module first, while ``group.WORLD`` is still ``None``.
- the model: the ``DistributedDataParallel`` wrapper, whose reducer holds the
  group, or a model sharded by FSDP2 (``fully_shard``), whose parameter groups
  hold it (``FSDPMeshInfo``). Drop it before :func:`leave`, or the group ends when
  the model does. A sharded model is a reference cycle (FSDP2's state and its
  module refer to each other), so dropping it frees nothing until the cyclic
  collector runs, perhaps during interpreter finalization: :func:`leave` collects,
  and collects again at exit (``atexit`` runs while the interpreter is whole), for
  a loop that leaves while its model is alive and drops it when it returns.
- FSDP2's ``DeviceMesh``. A mesh keeps the groups of its dimensions in
  ``_pg_registry`` (for ``torch.compile`` to find them; eager code looks groups up
  by name in c10d), and DTensor's caches keep meshes for the life of the process:
  the sharding-propagation caches (one per thread, and a C++ one), the
  redistribute planners, ``MeshTopoInfo``, all keyed by or holding a mesh. Clearing
  those caches is a list that grows with every torch release, and a user's thread
  may hold its own, so the meshes are released instead: sharded models take their
  mesh from :func:`device_mesh`, and :func:`leave` empties the registry of every
  mesh it made (torch 2.14.1 has no public call that does). A mesh is useless
  once its group is destroyed, whoever still holds it.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import gc
import ipaddress
import logging
import os
import socket
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

# torch.distributed re-exports it without naming it public; this is where it lives.
from torch._C._distributed_c10d import TCPStore

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

log = logging.getLogger("hetero.trainer.procgroup")

#: The meshes :func:`device_mesh` made, whose groups :func:`leave` releases.
_meshes: list[DeviceMesh] = []


def join(
    backend: str,
    *,
    rank: int,
    world_size: int,
    timeout: timedelta,
    device_id: torch.device | None = None,
) -> None:
    """``init_process_group``, once nothing imported later can pin the group (module doc)."""
    import torch.distributed.nn.functional  # noqa: F401  (binds group.WORLD while None)

    dist.init_process_group(
        backend,
        store=rendezvous_store(rank, world_size, timeout),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device_id,
    )


def rendezvous_store(rank: int, world_size: int, timeout: timedelta) -> TCPStore:
    """The job's rendezvous store at ``MASTER_ADDR:MASTER_PORT``, its server on rank 0
    listening on ``MASTER_ADDR`` alone.

    ``init_process_group``'s own (``env://``) server listens on every interface, so on
    a one-host job any local user (or any host, through the firewall) could read and
    write the job's keys. Rank 0 binds the listening socket itself and hands it to the
    store. One exception keeps multi-host jobs working: a ``MASTER_ADDR`` given by name
    that resolves to a loopback address here (Debian's ``127.0.1.1`` for the hostname)
    while ranks run on other hosts (``LOCAL_WORLD_SIZE`` below ``WORLD_SIZE``, or not
    set): other hosts reach that name at another address, so the server listens on
    every interface, as before (docs/deploy.md); so does a ``MASTER_ADDR`` that is no
    address of this host (a NAT's), with a warning. Under torchrun
    (``TORCHELASTIC_USE_AGENT_STORE``) torchrun's agent serves the store and every
    rank is its client, as with ``env://``; where it listens is torchrun's choice."""
    host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        raise ValueError("MASTER_ADDR and MASTER_PORT must be set to join a process group")
    # Under torchrun the elastic agent already serves the store at this address.
    agent_serves = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if rank != 0 or agent_serves:
        return TCPStore(host, int(port), world_size, is_master=False, timeout=timeout)
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    one_host = local.isdigit() and int(local) >= world_size
    listener = _listen(host, int(port), one_host)
    return TCPStore(
        host,
        int(port),
        world_size,
        is_master=True,
        timeout=timeout,
        master_listen_fd=listener.detach(),  # the store's server owns the socket now
    )


def _listen(host: str, port: int, one_host: bool) -> socket.socket:
    """A listening socket on ``host``'s address (:func:`rendezvous_store`)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        literal = _is_ip(host)
        if ipaddress.ip_address(address[0]).is_loopback and not (literal or one_host):
            return _listen_everywhere(port)
        try:
            return socket.create_server(address[:2], family=family)
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL:
                raise
            # An address other hosts reach this one at, not its own (a NAT's, a
            # proxy's): listening on it is impossible, so listen as torch would.
            log.warning(
                "MASTER_ADDR %s is no address of this host: the rendezvous listens on "
                "every interface",
                host,
            )
            return _listen_everywhere(port)
    except OSError as exc:
        raise RuntimeError(
            f"cannot listen for the rendezvous on {host}:{port}: {exc.strerror or exc}"
        ) from None


def _listen_everywhere(port: int) -> socket.socket:
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def device_mesh(device_type: str) -> DeviceMesh:
    """A 1-D mesh of every rank of the group, for ``device_type`` (``"cpu"``,
    ``"cuda"``): the mesh ``fully_shard`` builds when given none (``init_device_mesh``),
    whose hold on the group :func:`leave` releases. Collective, like ``fully_shard``."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    _meshes.append(mesh)
    return mesh


def leave(*, failed: bool = False) -> None:
    """Wait for every rank, then destroy the process group.

    The barrier means no collective of this rank is still in flight. A peer that
    is already gone makes it fail: then just leave. No-op without a group.

    ``failed``: this rank stops on an error. Its peers may be inside a collective
    that waits for it (an all-gather of the next layer, the gradient reduction),
    so a barrier would wait for them as they wait for us, until the collective
    timeout: leave at once, touching nothing of the group; the process exits with
    the error and the launcher (or the agent) stops the others.
    """
    if failed or not dist.is_initialized():
        return
    with contextlib.suppress(RuntimeError):
        dist.barrier()
    gc.collect()  # a dropped sharded model, a cycle that holds the group (module doc)
    _release_meshes()
    dist.destroy_process_group()
    atexit.unregister(gc.collect)  # once, however often a process leaves
    atexit.register(gc.collect)  # a sharded model still alive here (module doc)


def _release_meshes() -> None:
    """Drop the references of :func:`device_mesh`'s meshes to their groups (module doc)."""
    for mesh in _meshes:
        registry = getattr(mesh, "_pg_registry", None)
        if isinstance(registry, dict):
            registry.clear()
    _meshes.clear()
