"""Human output of ``hetero-coord``: rich tables of nodes, jobs, plans and predictions.

Unset telemetry prints as "n/a". ``--json`` output does not come through here.
Every field a job, a node or a user chose goes through :func:`shown`: no control
character reaches the terminal (``core.textsafe``) and no ``[...]`` is read as markup.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hetero.core.states import job_label, rank_label
from hetero.core.textsafe import printable
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

NA = "n/a"


def shown(text: str) -> str:
    """A field from a job, a node or a user, safe to print through rich (module doc)."""
    return escape(printable(text))


def state_name(job: pb.Job) -> str:
    """The job's state; an attached job's says who launched it: "running (slurm job 42)"."""
    return job_label(job.state) + (f" ({shown(job.launcher)})" if job.launcher else "")


def _age(unix_s: float) -> str:
    seconds = max(0.0, time.time() - unix_s)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _bytes(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _kind(kind: int) -> str:
    return str(tpb.DeviceKind.Name(kind)).removeprefix("DEVICE_KIND_").lower()


def nodes_table(nodes: Sequence[pb.Node]) -> Table:
    columns = ("node", "id", "health", "devices", "cpu", "ram", "gpu util / mem / temp")
    table = Table(*columns, "disk / links")
    for n in nodes:
        devices = ", ".join(
            f"{_kind(d.kind)}:{d.index} {shown(d.name)} (score {d.compute_score:g}"
            + (f", emulated x{d.emulated_slowdown:g}" if d.emulated_slowdown != 1.0 else "")
            + "".join(f"; {note}" for note in profile_notes(d))
            + ")"
            for d in n.devices
        )
        cpu = f"{n.host.cpu_percent:.0f}%" if n.host.HasField("cpu_percent") else NA
        ram = (
            f"{_bytes(n.host.ram_used_bytes)} / {_bytes(n.host.ram_total_bytes)}"
            if n.host.HasField("ram_used_bytes") and n.host.HasField("ram_total_bytes")
            else NA
        )
        gpus = "; ".join(_device_telemetry(t) for t in n.telemetry) or NA
        health = "[green]up[/]" if n.healthy else f"[red]down[/] ({_age(n.last_heartbeat_unix_s)})"
        row = (shown(n.name), n.id, health, devices or "none", cpu, ram, gpus)
        table.add_row(*row, host_io(n.host_profile) if n.HasField("host_profile") else NA)
    return table


def host_io(h: tpb.HostProfile) -> str:
    """The data disk's sequential read and the slowest link to another node, as the agent
    measured them: "1,275 MB/s read (o_direct); 2 links, slowest 117 MB/s, rtt 0.45 ms,
    measured 12m ago" (the older link's age; the coordinator measures a link again
    after an hour, when a job spans it)."""
    parts = []
    if h.HasField("disk_read_bytes_per_s"):
        parts.append(
            f"{h.disk_read_bytes_per_s / 1e6:,.0f} MB/s read ({shown(h.disk_read_method)})"
        )
    rates = [
        min(rate for rate in (link.send_bytes_per_s, link.receive_bytes_per_s) if rate > 0)
        for link in h.peer_links
        if link.send_bytes_per_s > 0 or link.receive_bytes_per_s > 0
    ]
    if h.peer_links:
        slowest = f", slowest {min(rates) / 1e6:,.0f} MB/s" if rates else ""
        rtt = max(link.rtt_s for link in h.peer_links)
        count = len(h.peer_links)
        stamps = [link.measured_at_unix_s for link in h.peer_links if link.measured_at_unix_s > 0]
        age = f", measured {_age(min(stamps))}" if stamps else ""
        parts.append(
            f"{count} link{'s' if count != 1 else ''}{slowest}, rtt {rtt * 1e3:.2f} ms{age}"
        )
    return "; ".join(parts) or NA


def profile_notes(d: tpb.DeviceProfile) -> list[str]:
    """Warnings about a device's profile: suspect figures, sharing with other processes."""
    notes = []
    if d.suspect:
        names = ", ".join(
            shown(f.removesuffix("_bytes_per_s").replace("_", " ")) for f in d.suspect
        )
        notes.append(f"[yellow]SUSPECT {names}[/] (above the device's limits; not scored)")
    if d.shared_while_profiled:
        notes.append("profiled while shared")
    if d.HasField("foreign_utilization_percent"):
        notes.append(f"other processes use {d.foreign_utilization_percent:.0f}%")
    return notes


def _device_telemetry(t: tpb.DeviceTelemetry) -> str:
    util = f"{t.utilization_percent:.0f}%" if t.HasField("utilization_percent") else NA
    mem = _bytes(t.memory_used_bytes) if t.HasField("memory_used_bytes") else NA
    temp = f"{t.temperature_c:.0f}C" if t.HasField("temperature_c") else NA
    return f"{t.device_index}: {util} / {mem} / {temp}"


def print_jobs(console: Console, resp: pb.ListJobsResponse) -> None:
    """The jobs table, and when jobs were left out, how many and how to see them."""
    console.print(jobs_table(resp.jobs))
    if resp.next_page_token:
        console.print(
            f"{len(resp.jobs):,} newest of {resp.total:,} jobs: --limit N or --all for more"
        )


def jobs_table(jobs: Sequence[pb.Job]) -> Table:
    """One row per job; while any job is queued, a last column says what each waits for."""
    queued = any(j.state == pb.JOB_STATE_QUEUED for j in jobs)
    columns = ["id", "name", "owner", "state", "ranks", "backend", "policy", "plan", "step"]
    table = Table(*columns, "submitted", *(["waiting for"] if queued else []))
    # The id is what the next command needs: whole, however narrow the terminal or pipe.
    table.columns[0].no_wrap, table.columns[0].min_width = (
        True,
        max((len(j.id) for j in jobs), default=0),
    )
    for j in jobs:
        plan = "/".join(str(b) for b in j.plan.batches)
        row = [
            j.id,
            shown(j.name),
            shown(j.owner) or "-",
            state_name(j),
            str(j.world_size),
            shown(j.backend) or "-",
            shown(j.policy),
            f"v{j.plan.version} {plan}" if j.plan.version else "-",
            str(j.last_step),
            _age(j.submitted_at_unix_s),
        ]
        if queued:
            row.append(queue_note(j))
        table.add_row(*row)
    return table


def queue_note(job: pb.Job) -> str:
    """A queued job's reason (and priority, when not 0); "" for any other job."""
    if job.state != pb.JOB_STATE_QUEUED:
        return ""
    reason = shown(job.message.removeprefix("waiting for "))
    return f"priority {job.priority}: {reason}" if job.priority else reason


def ranks_table(job: pb.Job) -> Table:
    table = Table("rank", "node", "local", "device", "batch", "state", "note")
    for r in job.ranks:
        batch = str(job.plan.batches[r.rank]) if r.rank < len(job.plan.batches) else NA
        state = rank_label(r.state)
        state = "-" if state == "unspecified" else state
        if r.HasField("exit_code"):
            state += f" ({r.exit_code})"
        note = f"emulated x{r.emulated_slowdown:g}" if r.emulated_slowdown != 1.0 else ""
        device = f"{_kind(r.device_kind)}:{r.device_index} {shown(r.device_name)}"
        table.add_row(
            str(r.rank), shown(r.node_name), str(r.local_rank), device, batch, state, note
        )
    return table


def predictions_table(predictions: Sequence[pb.PolicyPrediction], global_batch: int) -> Table:
    emulated = any(p.emulated for p in predictions)
    comm_s = max((p.comm_s for p in predictions), default=0.0)
    title = "predicted from hardware profiles" + (" (uses EMULATED slowdowns)" if emulated else "")
    if comm_s > 0:
        title += f", with {comm_s * 1e3:.1f} ms/step of all-reduce over the measured links"
    table = Table(
        "policy",
        "batches",
        "step (score units)",
        "samples/s (score units)",
        "vs equal",
        title=title,
    )
    equal = next((p for p in predictions if p.policy == "equal"), None)
    for p in predictions:
        ratio = p.predicted_samples_per_s / equal.predicted_samples_per_s if equal else 1.0
        table.add_row(
            p.policy,
            "/".join(str(b) for b in p.batches),
            f"{p.predicted_step_s:.3g}",
            f"{p.predicted_samples_per_s:.3g}",
            f"{ratio:.2f}x",
        )
    return table


def print_job(console: Console, job: pb.Job) -> None:
    state = state_name(job) if job.id else "dry run, nothing stored"
    if job.priority:
        state += f", priority {job.priority}"
    restarts = f"  restarts: {job.restarts}" if job.restarts else ""
    owner = f"  owner: {shown(job.owner)}" if job.owner else ""
    console.print(
        f"[bold]{shown(job.name)}[/] ({job.id or 'no id'})  state: {state}{restarts}{owner}"
    )
    if job.launcher:
        where = (
            f"attached: its ranks started by {shown(job.launcher)}, which places and restarts them"
        )
    elif job.state == pb.JOB_STATE_QUEUED:
        where = "not placed yet"
    else:
        where = (
            f"backend {shown(job.backend)}, rendezvous {shown(job.master_addr)}:{job.master_port}"
        )
    console.print(
        f"global batch {job.global_batch} over {job.world_size} ranks, policy {shown(job.policy)}, "
        + where
    )
    if job.message:
        label = "queued" if job.state == pb.JOB_STATE_QUEUED else "message"
        console.print(f"{label}: {shown(job.message)}")
    if job.plan.version:
        console.print(
            f"plan v{job.plan.version} from step {job.plan.apply_at_step}: "
            f"{list(job.plan.batches)} ({shown(job.plan.reason)})"
        )
        console.print(ranks_table(job))
    for e in job.events:
        console.print(
            f"  {time.strftime('%H:%M:%S', time.localtime(e.time_unix_s))} {shown(e.message)}"
        )
