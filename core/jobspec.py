"""The job spec: ``job.yaml`` parsed once into frozen, typed dataclasses.

A job runs either a built-in ``model`` on a ``dataset`` or the user's own
``command`` (a script using the trainer API). Its training options are the
catalogue's (``hetero.core.catalogue``): every option job.yaml takes is read
here by the same description ``hetero-train`` and ``ht.train`` use, with the
same names, defaults and bounds. What only a cluster job has — ``resources``,
``command``, ``max_restarts``, per-rank ``emulate_slowdown`` — is read here
too. Every error is a ``ConfigError`` naming the file, line and field;
unknown keys get a "did you mean" hint. ``docs/jobspec.md``'s table of keys is
generated from the catalogue (``python -m hetero.core.catalogue.reference``).
A little over the usual ~450 lines as ruff formats it: one file format, read in
one place, so that its errors all name the file, line and field the same way.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from hetero.core import defaults
from hetero.core.catalogue import BY_NAME, OPTIONS, Entry, OptionError, TrainingOptions
from hetero.core.catalogue.kinds import ListKind, PathKind
from hetero.core.catalogue.limits import MAX_RANKS
from hetero.core.catalogue.rules import pipeline_model
from hetero.core.errors import ConfigError
from hetero.core.roots import path_problem
from hetero.core.slowdown import MAX_FACTOR
from hetero.core.yamlfields import Fields, read_text

DEVICE_KINDS = ("any", "cuda", "cpu")
#: Bytes of job.yaml text; a spec is a page of YAML.
MAX_SPEC_BYTES = 1024 * 1024
MAX_RESTARTS = 1000
#: Queue priorities a job may have (``priority``; ``hetero-coord submit --priority``).
MIN_PRIORITY, MAX_PRIORITY = -1_000_000, 1_000_000
MAX_COMMAND_ARGS = 4096
#: Bytes of one command argument (Linux MAX_ARG_STRLEN).
MAX_ARG_BYTES = 128 * 1024

#: job.yaml's keys that are not training options, for the docs' table (key, type, default,
#: meaning); the parser below reads them.
CLUSTER_FIELDS: tuple[tuple[str, str, str, str], ...] = (
    (
        "resources.ranks",
        f"integer, 1 … {MAX_RANKS:,}",
        "required",
        "training processes (world size)",
    ),
    ("resources.device", "`cuda`, `cpu`, `any`", "`any`", "device kind; `any` prefers CUDA"),
    (
        "resources.allow_cpu",
        "true or false",
        "`true`",
        "with `device: any`, may ranks use CPU devices",
    ),
    ("resources.nodes", "list of node names", "all", "nodes the job may use"),
    (
        "resources.allow_exclusion",
        "true or false",
        "`true` for a built-in model, `false` with `command:`",
        "may the coordinator leave out a rank the job is forecast faster without "
        "([balancer](balancer.md#exclusion))",
    ),
    (
        "command",
        "string (split like a shell) or list of strings",
        "—",
        "your script, using the trainer API, instead of a built-in model; takes only the "
        "options the coordinator uses (name, batch, length, policy, checkpoint, slowdown)",
    ),
    (
        "max_restarts",
        f"integer, 0 … {MAX_RESTARTS:,}",
        "`0`",
        "restarts after a lost node or a failed rank: the job resumes from its checkpoint on "
        "the healthy devices ([reliability](reliability.md))",
    ),
    (
        "priority",
        f"integer, {MIN_PRIORITY:,} … {MAX_PRIORITY:,}",
        "`0`",
        "place in the coordinator's queue while devices are busy: higher first, equal ones in "
        "submission order (`hetero-coord submit --priority` overrides it; "
        "[deploy](deploy.md#queue-and-limits))",
    ),
)

#: Options read outside the generic loop: the job's name, the ``checkpoint:`` mapping
#: and the per-rank form of ``emulate_slowdown``.
_SPECIAL = ("name", "checkpoint_dir", "checkpoint_interval", "emulate_slowdown")
#: Options a ``command:`` job may set: the ones the coordinator itself uses. The rest
#: describe a built-in job, which a user's script builds for itself.
COMMAND_OPTIONS = frozenset(
    {
        "name",
        "global_batch",
        "batch_size",
        "steps",
        "epochs",
        "policy",
        "rebalance_interval",
        "min_batch",
        "collective_timeout_s",
        "emulate_slowdown",
        "checkpoint_dir",
        "checkpoint_interval",
    }
)
#: Options never sent to a rank: the coordinator resolves them (``batch_size`` into the
#: global batch) or hands them over by other means (slowdowns per rank, the timeout in
#: the rank's environment).
_NOT_LAUNCHED = frozenset({"batch_size", "emulate_slowdown", "collective_timeout_s"})
#: Sent to every rank even at their default: the coordinator plans with these, so the
#: rank must use the same values whatever its install's defaults are.
_ALWAYS_LAUNCHED = ("name", "policy", "rebalance_interval", "min_batch", "seed")


@dataclass(frozen=True)
class Resources:
    """Where the job's ranks may run.

    ``device`` is ``cuda``, ``cpu`` or ``any``; with ``any``, CUDA devices are
    preferred and CPU devices are used only if ``allow_cpu``. ``nodes`` lists the
    node names allowed (empty = any healthy node). ``allow_exclusion``: the coordinator
    may leave out a rank the job is forecast faster without (``coordinator.exclusion``).
    """

    ranks: int
    nodes: tuple[str, ...] = ()
    allow_cpu: bool = True
    device: str = "any"
    allow_exclusion: bool = False


@dataclass(frozen=True)
class Checkpoint:
    dir: str
    interval_steps: int


@dataclass(frozen=True)
class JobSpec:
    """A validated job. ``options`` are its training options (for a ``command`` job only
    the ones the coordinator uses are set); ``given`` names those the file set.
    ``emulate_slowdown[r]`` is rank r's emulated factor (1.0 = none), one per rank."""

    name: str
    resources: Resources
    options: TrainingOptions
    given: frozenset[str] = frozenset()
    command: tuple[str, ...] = ()
    checkpoint: Checkpoint | None = None
    max_restarts: int = 0
    emulate_slowdown: tuple[float, ...] = field(default=())
    #: Queue priority: higher is placed first (the coordinator's ``admission``).
    priority: int = 0

    @property
    def world_size(self) -> int:
        return self.resources.ranks

    @property
    def emulated(self) -> bool:
        return any(f != 1.0 for f in self.emulate_slowdown)

    @property
    def builtin(self) -> bool:
        return not self.command

    @property
    def model(self) -> str | None:
        return self.options.model if self.builtin else None

    @property
    def dataset(self) -> str | None:
        return self.options.dataset if self.builtin else None

    @property
    def data_dir(self) -> str | None:
        return self.options.data_dir

    @property
    def global_batch(self) -> int:
        """Samples per step over all ranks (``batch_size`` × ranks when that was given)."""
        return self.options.global_batch_for(self.world_size)

    @property
    def steps(self) -> int | None:
        """Total steps, or None when the job counts ``epochs`` (its rank 0 knows the steps)."""
        return self.options.steps_for(0) if self.options.epochs is None else None

    @property
    def epochs(self) -> int | None:
        return self.options.epochs

    @property
    def policy(self) -> str:
        return self.options.policy

    @property
    def rebalance_interval(self) -> int:
        return self.options.rebalance_interval

    @property
    def min_batch(self) -> int:
        return self.options.min_batch

    @property
    def seed(self) -> int:
        return self.options.seed

    @property
    def lr(self) -> float:
        """The learning rate the job trains with (given, or its optimizer's default)."""
        return self.options.learning_rate(self.options.optimizer_kind)

    @property
    def collective_timeout_s(self) -> float:
        return self.options.collective_timeout_s or defaults.JOB_COLLECTIVE_TIMEOUT_S

    def launch_options(self) -> dict[str, str]:
        """The options a rank's ``hetero-train`` gets, by name, as command-line text: every
        option the file set, the resolved global batch and length, and those the
        coordinator plans with. A ``command`` job gets the last two alone: they are the
        terms its script must agree with (``hetero.core.rankenv.JobTerms``)."""
        o = self.options
        names: list[str] = list(_ALWAYS_LAUNCHED)
        if self.builtin:
            names += [n for n in self.given if n not in _NOT_LAUNCHED and n not in _SPECIAL]
            names += ["model", "dataset"]
        texts = {n: BY_NAME[n].to_text(getattr(o, n)) for n in names if getattr(o, n) is not None}
        texts["global_batch"] = str(self.global_batch)
        texts.update({"epochs": str(o.epochs)} if o.epochs else {"steps": str(self.steps)})
        if self.checkpoint is not None and self.builtin:
            texts["checkpoint_dir"] = self.checkpoint.dir
            texts["checkpoint_interval"] = str(self.checkpoint.interval_steps)
        return texts


def load_jobspec(path: str | Path) -> JobSpec:
    """Read and parse a job file; a missing, unreadable, oversized or non-UTF-8 file is a
    ``ConfigError`` (at most ``MAX_SPEC_BYTES + 1`` bytes are read)."""
    return parse_jobspec(read_job_file(path), source=str(path))


def read_job_file(path: str | Path) -> str:
    """A job file's text, read once: at most ``MAX_SPEC_BYTES`` of UTF-8."""
    return read_text(path, "job file", MAX_SPEC_BYTES)


def parse_jobspec(
    text: str,
    source: str = "job.yaml",
    *,
    allowed_roots: Sequence[str] | None = None,
    private: Sequence[str] = (),
) -> JobSpec:
    """Parse and validate the YAML text of a job spec.

    ``allowed_roots``: directories ``checkpoint.dir``, ``data_dir`` and ``tensorboard``
    must lie under (``hetero.core.roots``); None checks only that they are absolute.
    ``private``: the coordinator's own files and directories, which none may hold."""
    if len(text) > MAX_SPEC_BYTES:  # characters >= bytes / 4: cheap before encoding
        raise ConfigError(
            f"{source}: job spec is {len(text):,} characters, limit {MAX_SPEC_BYTES:,}"
        )
    top = Fields.parse(text, source)
    if not top.has("name"):
        raise ConfigError(f"{source}:{top.line_of('name')}: name: required")
    name = _checked(top, BY_NAME["name"], top.scalar("name"))
    command = _command(top)
    resources = _resources(top, builtin=not command)
    places: dict[str, tuple[Fields, str]] = {}
    given: dict[str, Any] = {}
    for option in OPTIONS:
        if Entry.YAML not in option.where or option.name in _SPECIAL or not top.has(option.key):
            continue
        if command and option.name not in COMMAND_OPTIONS:
            top.raw(option.key)  # read, so finish() reports the conflict, not "unknown"
            raise top.fail(option.key, "not allowed with command: (the script builds its own)")
        given[option.name] = _checked(top, option, _value(top, option))
        places[option.name] = (top, option.key)
        if isinstance(option.kind, PathKind) and (
            problem := path_problem(given[option.name], allowed_roots, private)
        ):
            raise top.fail(option.key, problem)
    checkpoint = _checkpoint(top, allowed_roots, private, given, places)
    emulate_slowdown = _slowdowns(top, resources.ranks)
    try:
        options = TrainingOptions(name=name, **given)
    except OptionError as exc:
        fields, key = places.get(exc.option, (top, BY_NAME[exc.option].key))
        message = exc.detail_for(lambda n: BY_NAME[n].key)
        if exc.option not in places and exc.anchor in places:
            raise fields.fail_near(places[exc.anchor][1], key, message) from None
        raise fields.fail(key, message) from None
    if options.pipeline > 1:
        resources = _pipelined(top, resources, options)
    spec = JobSpec(
        name=name,
        resources=resources,
        options=options,
        given=frozenset(given),
        command=command,
        checkpoint=checkpoint,
        max_restarts=top.integer("max_restarts", 0, minimum=0, maximum=MAX_RESTARTS) or 0,
        emulate_slowdown=emulate_slowdown,
        priority=top.integer("priority", 0, minimum=MIN_PRIORITY, maximum=MAX_PRIORITY) or 0,
    )
    if spec.global_batch < spec.min_batch * resources.ranks:
        key = "batch_size" if "batch_size" in given else "global_batch"
        raise top.fail(
            key,
            f"{spec.global_batch} is smaller than min_batch {spec.min_batch} x {resources.ranks} ranks",
        )
    top.finish()
    return spec


def check_priority(priority: int) -> None:
    """A ``ConfigError`` for a priority outside [MIN_PRIORITY, MAX_PRIORITY]."""
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ConfigError(
            f"priority: must be in [{MIN_PRIORITY:,}, {MAX_PRIORITY:,}], got {priority:,}"
        )


def _value(top: Fields, option: Any) -> Any:
    """The value under the option's key: a scalar, or for a list option a list of scalars."""
    node = top.raw(option.key)
    if isinstance(option.kind, ListKind) and isinstance(node, yaml.SequenceNode):
        return [
            top.value_of(n, option.key) if isinstance(n, yaml.ScalarNode) else {}
            for n in node.value
        ]
    return top.scalar(option.key)


def _checked(fields: Fields, option: Any, value: Any, key: str | None = None) -> Any:
    key = key or option.key.rsplit(".", 1)[-1]
    if value is None:
        raise fields.fail(key, f"must not be empty ({option.kind.describe()})")
    try:
        return option.check(value)
    except OptionError as exc:
        raise fields.fail(key, exc.detail_for(lambda n: BY_NAME[n].key)) from None


def _resources(top: Fields, *, builtin: bool) -> Resources:
    res = top.mapping("resources")
    if res is None:
        raise top.fail("resources", "required, e.g. `resources: {ranks: 2}`")
    ranks = res.integer("ranks", minimum=1, maximum=MAX_RANKS)
    if ranks is None:
        raise res.fail("ranks", "required (number of training processes)")
    device = res.choice("device", DEVICE_KINDS, "any") or "any"
    allow_cpu = res.boolean("allow_cpu", True)
    if device == "cpu" and not allow_cpu:
        raise res.fail("allow_cpu", "is false but device is cpu: no device could run the job")
    nodes: tuple[str, ...] = ()
    node = res.raw("nodes")
    if node is not None:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise res.fail("nodes", "must be a non-empty list of node names")
        values = [
            res.value_of(n, "nodes") if isinstance(n, yaml.ScalarNode) else None for n in node.value
        ]
        if any(not isinstance(v, str) or not v for v in values):
            raise res.fail("nodes", "must be a list of node names (strings)")
        nodes = tuple(str(v) for v in values)
    exclusion = res.boolean("allow_exclusion", builtin)  # off for a script: fewer ranks
    res.finish()
    return Resources(ranks, nodes, allow_cpu, device, allow_exclusion=exclusion)


def _pipelined(top: Fields, resources: Resources, options: TrainingOptions) -> Resources:
    """A pipeline job's model and resources: a language model, ranks a multiple of its
    stages, and no rank left out (its replicas need every stage): exclusion is off unless
    asked for, and refused then."""
    stages = options.pipeline
    try:
        pipeline_model(options)
    except OptionError as exc:
        raise top.fail("pipeline", exc.detail_for(lambda n: BY_NAME[n].key)) from None
    if resources.ranks % stages:
        raise top.fail(
            "pipeline",
            f"{stages} stages do not divide resources.ranks {resources.ranks}: each pipeline "
            f"replica needs all {stages}",
        )
    res = top.mapping("resources")
    if res is not None and res.has("allow_exclusion") and resources.allow_exclusion:
        raise res.fail(
            "allow_exclusion", "not with pipeline: a replica's stages need every one of its ranks"
        )
    return replace(resources, allow_exclusion=False)


def _command(top: Fields) -> tuple[str, ...]:
    args = _command_args(top)
    if len(args) > MAX_COMMAND_ARGS:
        raise top.fail("command", f"has {len(args)} arguments, limit {MAX_COMMAND_ARGS}")
    for arg in args:
        if "\x00" in arg:
            raise top.fail("command", "arguments must not contain a NUL character")
        if len(arg.encode("utf-8", errors="replace")) > MAX_ARG_BYTES:
            raise top.fail("command", f"an argument is longer than {MAX_ARG_BYTES:,} bytes")
    return args


def _command_args(top: Fields) -> tuple[str, ...]:
    node = top.raw("command")
    if node is None:
        return ()
    if isinstance(node, yaml.ScalarNode):
        value = top.value_of(node, "command")
        if not isinstance(value, str) or not value.strip():
            raise top.fail("command", "must be a command line or a list of arguments")
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:
            raise top.fail("command", f"cannot split into arguments: {exc}") from None
    if isinstance(node, yaml.SequenceNode) and node.value:
        args = [
            top.value_of(n, "command") if isinstance(n, yaml.ScalarNode) else None
            for n in node.value
        ]
        if all(isinstance(a, str | int | float) and not isinstance(a, bool) for a in args):
            return tuple(str(a) for a in args)
    raise top.fail("command", "must be a command line or a non-empty list of arguments")


def _checkpoint(
    top: Fields,
    roots: Sequence[str] | None,
    private: Sequence[str],
    given: dict[str, Any],
    places: dict[str, tuple[Fields, str]],
) -> Checkpoint | None:
    """``checkpoint: {dir, interval_steps}``: the options checkpoint_dir and checkpoint_interval."""
    ck = top.mapping("checkpoint")
    if ck is None:
        return None
    if not ck.has("dir"):
        raise ck.fail("dir", "required (directory shared by the job's nodes)")
    directory = _checked(ck, BY_NAME["checkpoint_dir"], ck.scalar("dir"))
    if problem := path_problem(directory, roots, private):
        raise ck.fail("dir", problem)
    given["checkpoint_dir"], places["checkpoint_dir"] = directory, (ck, "dir")
    if ck.has("interval_steps"):
        option = BY_NAME["checkpoint_interval"]
        given["checkpoint_interval"] = _checked(ck, option, ck.scalar("interval_steps"))
        places["checkpoint_interval"] = (ck, "interval_steps")
    ck.finish()
    probe = TrainingOptions(
        checkpoint_dir=directory, checkpoint_interval=given.get("checkpoint_interval")
    )
    return Checkpoint(dir=directory, interval_steps=probe.checkpoint_every)


@functools.lru_cache(maxsize=64)
def _no_slowdown(ranks: int) -> tuple[float, ...]:
    """``(1.0,) * ranks``, one tuple per world size: a coordinator holds thousands of specs,
    and a tuple of a float per rank each is most of a large job's spec."""
    return (1.0,) * ranks


def _slowdowns(top: Fields, ranks: int) -> tuple[float, ...]:
    """``emulate_slowdown`` as a list (one factor per rank) or a mapping ``{rank: factor}``."""
    node = top.raw("emulate_slowdown")
    if node is None:
        return _no_slowdown(ranks)
    factors = [1.0] * ranks
    key = "emulate_slowdown"
    if isinstance(node, yaml.SequenceNode):
        if len(node.value) != ranks:
            raise top.fail(key, f"has {len(node.value)} entries for {ranks} ranks")
        pairs = list(enumerate(node.value))
    elif isinstance(node, yaml.MappingNode):
        pairs = []
        for key_node, value_node in node.value:
            rank = top.value_of(key_node, key)
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < ranks:
                raise top.fail(key, f"rank {rank!r} is not in 0..{ranks - 1}", key_node)
            pairs.append((rank, value_node))
    else:
        raise top.fail(key, "must be a list (one factor per rank) or a mapping {rank: factor}")
    for rank, value_node in pairs:
        value = top.value_of(value_node, key) if isinstance(value_node, yaml.ScalarNode) else None
        where = f"{key}[{rank}]"
        factor = top.check_number(where, value, minimum=1.0, node=value_node)
        if factor > MAX_FACTOR:
            raise top.fail(where, f"must be <= {MAX_FACTOR:g}, got {factor:g}", value_node)
        factors[rank] = factor
    return tuple(factors)
