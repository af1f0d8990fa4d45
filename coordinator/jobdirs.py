"""The directories a job writes, and who may share them: refused at submit when another
owner's job that has not finished uses one.

A job writes its checkpoints in ``checkpoint.dir`` and, a built-in job, its TensorBoard
scalars in ``tensorboard``. Each of those directories belongs, while the job is queued
or placed (restarts included), to the job's **owner**: the name the coordinator
recorded the job under, which is also whose ``jobs_per_user`` budget it counts in and
who may cancel it (``identity.Caller.label``). A user's own credential or certificate
is one owner ("user:ana"); every holder of a shared token is the same owner ("user
token", "cluster token"), and so is every caller of a coordinator without
authentication ("anyone"): per-user credentials are what tell people apart.

A submission naming a directory that is, holds, or lies in a directory of another
owner's active job is refused (``FAILED_PRECONDITION``, one line naming that job's id,
not its owner): its ``last.pt`` would replace the first job's, whose restarts would
then refuse it (a checkpoint records its job) until it failed. Whoever writes a
directory also holds the names in it, so nesting counts as sharing. The same owner may
reuse a directory, which is how a job is resubmitted to resume from its checkpoint.
A directory is free again once its job has finished.

The comparison is lexical (``core.roots``), as the allowed roots' is.

Pure: the state's jobs in, an error out.
"""

from __future__ import annotations

from collections.abc import Iterable

from hetero.coordinator.state import Job
from hetero.core.errors import HeteroError
from hetero.core.jobspec import JobSpec
from hetero.core.roots import inside, normalize, overlap


class DirectoryInUseError(HeteroError):
    """A directory another owner's active job writes."""

    grpc_code = "FAILED_PRECONDITION"


def written(spec: JobSpec) -> list[tuple[str, str]]:
    """The directories ``spec`` writes, each with its job.yaml key, normalised."""
    found = [("checkpoint.dir", spec.checkpoint.dir if spec.checkpoint else None)]
    found.append(("tensorboard", spec.options.tensorboard))
    return [(key, normalize(path)) for key, path in found if path]


def check_directories(spec: JobSpec, owner: str, jobs: Iterable[Job], source: str) -> None:
    """Raise ``DirectoryInUseError`` if ``spec`` writes a directory that a job of
    ``jobs`` not finished and not ``owner``'s writes too."""
    mine = written(spec)
    if not mine:
        return
    for job in jobs:
        if job.finished or job.owner == owner:
            continue
        for key, path in mine:
            theirs = next((d for _, d in written(job.spec) if overlap(path, d)), None)
            if theirs is None:
                continue
            shared = "is" if theirs == path else ("holds" if inside(theirs, path) else "lies in")
            raise DirectoryInUseError(
                f"{source}: {key}: {path} {shared} {theirs}, a directory of job {job.id} "
                "(another owner's, not finished); give this job a directory of its own"
            )
