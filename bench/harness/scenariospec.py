"""What a benchmark scenario is: frozen dataclasses of the runs it asks for.

Read from YAML and checked by ``scenario`` (``load_scenario``); what each field
means is documented on it here. Kept apart from the reading so the runner, the
report and the simulator's tests can name a scenario's parts without the parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero.bench.harness.targets import Target
from hetero.bench.zoo import LOADER_PATHS
from hetero.bench.zoo.delays import parse_input_cost, parse_jitter

#: Policies ``hetero-train`` knows (checked here without importing the trainer).
POLICIES = ("equal", "proportional", "dynamic", "hybrid")
#: Run names that are not hetero policies: the external baseline and the GPU-alone reference.
BASELINE = "ddp"
GPU_ONLY = "gpu-only"
DEVICES = ("cpu", "cuda", "mixed")
LOOPS = ("builtin", "zoo")


@dataclass(frozen=True)
class Neighbour:
    """A co-located process of back-to-back ``matmul_size``² bf16 matmuls on ``gpu``.

    Present for the whole run when ``arrive_step`` is ``None``; otherwise it
    starts idle and the harness switches it on at the first metrics boundary
    at or after ``arrive_step`` and off at the first at or after ``leave_step``.
    """

    gpu: int = 1
    matmul_size: int = 8192
    arrive_step: int | None = None
    leave_step: int | None = None
    device: str | None = None  # torch device; default cuda:<gpu> ("cpu" lets tests exercise it)
    #: Fraction of wall time it keeps the GPU busy: 1.0 = back to back ("heavy"); less
    #: = it idles after each burst for burst time × (1/duty − 1) ("light").
    duty: float = 1.0

    @property
    def torch_device(self) -> str:
        return self.device or f"cuda:{self.gpu}"

    @property
    def weight(self) -> str:
        return "heavy" if self.duty >= 1.0 else f"light ({self.duty:.0%} duty)"


@dataclass(frozen=True)
class Slowdown:
    """An emulated CPU slowdown: ``rank`` is ``factor``× slower on steps [start, end)."""

    rank: int
    factor: float
    start: int = 0
    end: int | None = None

    def spec(self) -> str:
        window = "" if (self.start == 0 and self.end is None) else f"@{self.start}-{self.end or ''}"
        return f"{self.rank}:{self.factor:g}{window}"


@dataclass(frozen=True)
class RunOverride:
    """Per-run settings where one run is slow by construction (e.g. equal batches on a CPU)."""

    steps: int | None = None
    ideal_steps: int | None = None


@dataclass(frozen=True)
class RunKey:
    """One run of a scenario: its name and what sets it apart. ``num_workers`` is 0 on
    the device path; ``repeat`` counts from 1."""

    name: str
    policy: str
    data_path: str
    num_workers: int
    repeat: int


@dataclass(frozen=True)
class Scenario:
    """Everything one ``hetero-bench run`` needs. ``steps`` and change steps are optimizer steps."""

    name: str
    devices: str
    ranks: int
    gpus: int
    model: str
    global_batch: int
    steps: int
    description: str = ""
    rebalance_interval: int = 10
    ideal_steps: int = 8
    image_size: int | None = None
    num_classes: int = 10
    num_samples: int = 8192
    amp: str = "none"
    channels_last: bool = False
    lr: float = 0.05
    min_batch: int = 1
    dataset: str | None = None  # default: synthetic (images) or synthetic-text (language models)
    seq_len: int | None = None  # language models: tokens per sample (default: the model's)
    policies: tuple[str, ...] = POLICIES
    baseline: bool = True
    gpu_only_reference: bool = False
    neighbours: tuple[Neighbour, ...] = ()
    slowdowns: tuple[Slowdown, ...] = ()
    overrides: tuple[tuple[str, RunOverride], ...] = ()
    quick_steps: int | None = None
    quick_ideal_steps: int | None = None
    quick_policies: tuple[str, ...] | None = None
    quick_data_paths: tuple[str, ...] | None = None
    run_timeout_s: float = 300.0
    #: hetero-train's --shard for every hetero run (FSDP2; the DDP baseline cannot shard,
    #: so a sharded scenario sets ``baseline: false`` and compares with ``equal``).
    shard: str = "none"
    #: hetero-train's --offload for every hetero run (needs ``shard``): ``params`` keeps
    #: the shards, their gradients and the optimizer state in host memory.
    offload: str = "none"
    #: hetero-train's --memory-fraction: cap each rank's CUDA allocator (e.g. "1.0,0.3").
    memory_fraction: str | None = None
    #: hetero-train's --activation-checkpointing for every hetero run (language models).
    activation_checkpointing: bool = False
    loop: str = "builtin"
    data_paths: tuple[str, ...] = ("device",)
    #: DataLoader workers per rank on the loader and jpeg paths: each count is a variant
    #: (runs named ``-w<N>`` when there are several).
    num_workers: tuple[int, ...] = (6,)
    #: Every run this many times, the runs of one repeat together (plain DDP, then the
    #: policies): alternating pairs, so drift of the machine falls on both sides.
    repeats: int = 1
    #: ``--loader-jitter`` (``zoo.delays``) for every run of a DataLoader path.
    loader_jitter: str | None = None
    #: ``--input-cost-ms`` (``zoo.delays``, EMULATED) for every run of a DataLoader path.
    input_cost_ms: str | None = None
    #: ``--jpeg-sides`` (``MIN-MAX`` px) of the ``jpeg`` data path's files.
    jpeg_sides: str | None = None
    targets: tuple[Target, ...] = ()
    quick_repeats: int | None = None
    quick_num_workers: tuple[int, ...] | None = None

    @property
    def emulated(self) -> bool:
        """Whether any run's heterogeneity or input cost is injected rather than real."""
        return bool(self.slowdowns or self.input_cost_ms)

    def emulation(self) -> list[str]:
        """What is injected, one phrase each (slowdowns, input cost, jitter)."""
        out = [f"EMULATED slowdowns {self.emulate_spec}"] if self.slowdowns else []
        for spec in (parse_input_cost(self.input_cost_ms), parse_jitter(self.loader_jitter)):
            if spec is not None:
                out.append(spec.describe())
        return out

    @property
    def neighbour(self) -> Neighbour | None:
        """The first neighbour (most scenarios have at most one)."""
        return self.neighbours[0] if self.neighbours else None

    @property
    def emulate_spec(self) -> str | None:
        return ",".join(s.spec() for s in self.slowdowns) or None

    @property
    def change_steps(self) -> tuple[tuple[int, str], ...]:
        """(step, label) of every sudden change, ascending: neighbour or slowdown windows."""
        out: list[tuple[int, str]] = []
        for n in self.neighbours:
            if n.arrive_step is None:
                continue
            out.append((n.arrive_step, f"neighbour arrives on GPU {n.gpu}"))
            if n.leave_step is not None:
                out.append((n.leave_step, f"neighbour leaves GPU {n.gpu}"))
        for s in self.slowdowns:
            if s.start > 0:
                out.append((s.start, f"rank {s.rank} slows {s.factor:g}x (emulated)"))
            if s.end is not None:
                out.append((s.end, f"rank {s.rank} back to full speed (emulated)"))
        return tuple(sorted(out))

    def runs(self) -> tuple[RunKey, ...]:
        """The runs in order: per data path and worker count, ``repeats`` times the
        baseline, then the GPU-alone reference, then the policies. Names: the policy (or
        ``ddp``, ``gpu-only``), then for a ``zoo`` scenario ``-<path>``, then ``-w<N>``
        where ``num_workers`` lists several counts, then ``-r<K>`` where ``repeats`` > 1."""
        names = [BASELINE] if self.baseline else []
        if self.gpu_only_reference:
            names.append(GPU_ONLY)
        names += self.policies
        out = []
        for path in self.data_paths if self.loop == "zoo" else self.data_paths[:1]:
            loads = path in LOADER_PATHS and self.loop == "zoo"
            for workers in self.num_workers if loads else (0,):
                for k in range(1, self.repeats + 1):
                    for n in names:
                        name = n + (f"-{path}" if self.loop == "zoo" else "")
                        name += f"-w{workers}" if loads and len(self.num_workers) > 1 else ""
                        name += f"-r{k}" if self.repeats > 1 else ""
                        out.append(RunKey(name, n, path, workers, k))
        return tuple(out)

    def run_names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.runs())

    def override(self, run: str) -> RunOverride:
        return dict(self.overrides).get(run, RunOverride())
