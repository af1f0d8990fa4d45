"""Speed-sized pipeline stages against the even split, one run each under the same schedule.

On two GPUs, GPU 1 shared with a matmul-heavy neighbour (issue #36's target)::

    python -m hetero.bench.pipeline --device cuda --model gpt2-large --stages 2 \\
        --neighbour-gpu 1 --out results/pipeline/gpt2-large-2xh200

On CPU, heterogeneity EMULATED (a stage waits ``(f − 1)`` times its own compute after each
pass, ``hetero.trainer.emulation``) and every line says so::

    python -m hetero.bench.pipeline --model gpt2-tiny --layers 12 --slowdown 1,2 --out DIR

One rank a stage (NCCL on CUDA, Gloo on CPU). ``--neighbour-gpu N`` starts, before the
ranks, ``hetero.bench.harness.neighbour`` on GPU ``N`` (back-to-back bf16 matmuls) and
stops it after them. Rank 0 profiles the model on its device at the microbatch size
(``hetero.trainer.pipeline.profile``); every rank times a block on its own device at once
(``speed_probe``: the neighbour's share shows); the even split
(:func:`hetero.core.stages.even_partition`), the speed-sized one (``partition``) and the
re-cut then train in turn, ``--warmup`` steps and ``--steps`` measured each, from the same weights.

It prints, for each run, the blocks a stage, each stage's predicted and measured seconds a
microbatch (its own compute, CUDA events on a GPU; not its waits for its neighbour), the
predicted step (``sum(t) + (M − 1)·max(t)``: no transfers, no optimizer) and the measured
one (median wall time of a step, optimizer included); then the speed-sized split's step
rate over the even one's, and its step against the ideal: the step of a split balanced
exactly for the speeds the even run measured (``ideal_step_seconds``, the sum of the
stage times at balance plus the bubble). A third run trains the split a re-cut at a
checkpoint would choose from those speeds (``measured_speeds``), predicted from them. With ``--out DIR`` it writes ``DIR/intervals.jsonl.gz`` (one record every
``--interval`` steps a run: each rank's stage seconds a microbatch and the steps' wall
times) and ``DIR/summary.json`` (everything printed, the command and the devices).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hetero.core.stages import (
    Device,
    Model,
    Partition,
    Pipeline,
    Schedule,
    even_partition,
    ideal_step_seconds,
    measured_speeds,
    partition,
    step_seconds,
)
from hetero.trainer.launch import launch_local
from hetero.trainer.models.transformer import CONFIGS, GPT, BertMLM, build_transformer
from hetero.trainer.pipeline import build, profile, speed_probe

#: Bytes a CPU stage may use, for the partitioner (host memory is not what binds here).
CPU_BYTES = float(2**40)


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m hetero.bench.pipeline", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model", default="gpt2-tiny", choices=sorted(CONFIGS))
    p.add_argument("--layers", type=int, help="blocks (default: the model's)")
    p.add_argument("--d-model", type=int, help="width (default: the model's; d_ff is 4x)")
    p.add_argument("--seq-len", type=int, help="tokens a sample (default: the model's)")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--slowdown", help="each stage's EMULATED slowdown, e.g. 1,2 (CPU)")
    p.add_argument("--neighbour-gpu", type=int, help="start a matmul-heavy neighbour here")
    p.add_argument("--neighbour-size", type=int, default=8192, help="its matrices' side")
    p.add_argument("--microbatch", type=int, default=4, help="samples a microbatch")
    p.add_argument("--microbatches", type=int, default=16, help="microbatches a step")
    p.add_argument("--warmup", type=int, default=3, help="steps a run before measuring")
    p.add_argument("--steps", type=int, default=10, help="steps a run measures")
    p.add_argument("--interval", type=int, default=2, help="steps a raw record")
    p.add_argument("--schedule", default="1f1b", choices=[s.value for s in Schedule])
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    p.add_argument(
        "--no-tf32", action="store_true", help="full fp32 matmuls on CUDA (default: TF32)"
    )
    p.add_argument("--out", type=Path, help="folder for intervals.jsonl.gz and summary.json")
    p.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _factors(a: argparse.Namespace) -> list[float]:
    return [float(f) for f in a.slowdown.split(",")] if a.slowdown else [1.0] * a.stages


def _model(a: argparse.Namespace) -> GPT | BertMLM:
    torch.manual_seed(0)
    cfg = CONFIGS[a.model]
    over: dict[str, int] = {}
    if a.layers:
        over["n_layers"] = a.layers
    if a.d_model:
        over |= {"d_model": a.d_model, "d_ff": 4 * a.d_model}
    if a.seq_len and a.seq_len > cfg.max_seq_len:
        over["max_seq_len"] = a.seq_len
    return build_transformer(a.model, **over)


def _seq_len(a: argparse.Namespace) -> int:
    return int(a.seq_len or CONFIGS[a.model].seq_len)


def _batch(a: argparse.Namespace, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    vocab = CONFIGS[a.model].vocab_size - 1
    ids = torch.randint(0, vocab, (a.microbatch * a.microbatches, _seq_len(a) + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _gather(value: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _run(
    a: argparse.Namespace, name: str, split: Partition, device: torch.device, raw: list[Any]
) -> tuple[float, list[float]]:
    """Train ``split``: the median wall seconds a step and each stage's seconds a
    microbatch over the measured steps; a raw record every ``--interval`` steps."""
    pipe = build(
        _model(a), split.bounds, a.microbatch, schedule=Schedule(a.schedule), device=device
    )
    rank = dist.get_rank()
    pipe.clock.slowdown = _factors(a)[rank]
    params = pipe.module.parameters()
    opt: torch.optim.Optimizer = (
        torch.optim.AdamW(params, lr=1e-4)
        if a.optimizer == "adamw"
        else torch.optim.SGD(params, lr=1e-3)
    )
    walls: list[float] = []
    window: list[float] = []
    total, passes = 0.0, 0
    for step in range(a.warmup + a.steps):
        x, y = (t.to(device) for t in _batch(a, step))
        _sync(device)
        dist.barrier()
        start = time.perf_counter()
        pipe.step(x, y)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        dist.barrier()
        wall = time.perf_counter() - start
        if step == a.warmup - 1:
            pipe.clock.take()  # the warm-up's compute is not measured
        if step < a.warmup:
            continue
        walls.append(wall)
        window.append(wall)
        if len(window) == a.interval or step == a.warmup + a.steps - 1:
            seconds, injected, n = pipe.clock.take()
            total, passes = total + seconds, passes + n
            stages = _gather([seconds / max(n, 1), injected / max(n, 1), n])
            if rank == 0:
                raw.append(
                    {
                        "run": name,
                        "bounds": list(split.bounds),
                        "end_step": step + 1 - a.warmup,
                        "steps": len(window),
                        "step_wall_s": window,
                        "stage_s_per_microbatch": [s[0] for s in stages],
                        "stage_emulated_s_per_microbatch": [s[1] for s in stages],
                        "stage_microbatches": [s[2] for s in stages],
                    }
                )
            window = []
    del pipe, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return statistics.median(walls), _gather(total / max(passes, 1))


def _devices(a: argparse.Namespace, model: GPT | BertMLM, device: torch.device) -> list[Device]:
    """Each stage's device as its rank measures it against rank 0 (``speed_probe``, the
    EMULATED slowdown dividing), and its memory."""
    x, _ = _batch(a, 0)
    probe = speed_probe(model, x[: a.microbatch], device) * _factors(a)[dist.get_rank()]
    room = (
        float(torch.cuda.get_device_properties(device).total_memory)
        if device.type == "cuda"
        else CPU_BYTES
    )
    every = _gather([probe, room])
    return [Device(every[0][0] / s, r) for s, r in every]


def _rank(a: argparse.Namespace) -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = a.device == "cuda"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = not a.no_tf32
        torch.backends.cudnn.allow_tf32 = not a.no_tf32
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    pipe_cfg = Pipeline(a.microbatches, a.microbatch, Schedule(a.schedule))
    model = _model(a)
    devices = _devices(a, model, device)
    found: list[Any] = [None]
    if dist.get_rank() == 0:
        x, y = (t[: a.microbatch].to(device) for t in _batch(a, 0))
        costs = profile(model.to(device), x, y)
        found = [
            (costs, even_partition(costs, devices, pipe_cfg), partition(costs, devices, pipe_cfg))
        ]
    del model
    dist.broadcast_object_list(found, src=0)
    costs, even, sized = found[0]
    raw: list[Any] = []
    results = {
        name: (split, *_run(a, name, split, device, raw))
        for name, split in (("even", even), ("speed-sized", sized))
    }
    # What a re-cut at a checkpoint does: a split from the speeds the even run measured.
    recut = _recut(a, costs, devices, results["even"])
    results["re-cut"] = (recut, *_run(a, "re-cut", recut, device, raw))
    if dist.get_rank() == 0:
        summary = _report(a, costs, devices, results)
        if a.out is not None:
            _write(a, raw, summary)
    dist.destroy_process_group()


def _recut(
    a: argparse.Namespace,
    costs: Model,
    devices: list[Device],
    even: tuple[Partition, float, list[float]],
) -> Partition:
    """The split for the speeds the even run measured (``measured_speeds``), as the
    pipeline's re-cut at a checkpoint chooses it (the same on every rank: the stage
    seconds are gathered)."""
    split, _, stage_s = even
    speeds = measured_speeds(costs, split.bounds, stage_s)
    read = [Device(s, d.capacity_bytes) for s, d in zip(speeds, devices, strict=True)]
    return partition(costs, read, Pipeline(a.microbatches, a.microbatch, Schedule(a.schedule)))


def _report(
    a: argparse.Namespace,
    costs: Model,
    devices: list[Device],
    results: dict[str, tuple[Partition, float, list[float]]],
) -> dict[str, Any]:
    """Print the run's figures (module doc) and return them."""
    emu = "EMULATED " if a.slowdown else ""
    n = a.neighbour_gpu
    where = a.device if n is None else f"cuda, GPU {n} shared with a matmul-heavy neighbour"
    layers = len(costs.blocks)
    print(
        f"{emu}{a.model} {layers} blocks, seq {_seq_len(a)}, {a.microbatches} x {a.microbatch} "
        f"samples a step, {a.schedule}, {a.stages} stages on {where}"
        + (f", slowdowns {a.slowdown}" if a.slowdown else "")
    )
    print(f"{emu}speeds measured at the start: " + ", ".join(f"{d.speed:.2f}" for d in devices))
    out: dict[str, Any] = {"runs": {}}
    for name, (split, step_s, stage_s) in results.items():
        predicted = step_seconds(split.stage_seconds, a.microbatches)
        errors = [p / m - 1 for p, m in zip(split.stage_seconds, stage_s, strict=True)]
        print(
            f"{emu}{name:11} blocks {split.sizes} | s/microbatch a stage predicted "
            + " ".join(f"{s * 1e3:.1f}ms" for s in split.stage_seconds)
            + " measured "
            + " ".join(f"{s * 1e3:.1f}ms" for s in stage_s)
            + " ("
            + " ".join(f"{e:+.0%}" for e in errors)
            + f") | step predicted {predicted * 1e3:.0f}ms measured {step_s * 1e3:.0f}ms"
        )
        out["runs"][name] = {
            "bounds": list(split.bounds),
            "blocks": list(split.sizes),
            "predicted_stage_s": list(split.stage_seconds),
            "measured_stage_s": stage_s,
            "predicted_vs_measured": errors,
            "predicted_step_s": predicted,
            "measured_step_s": step_s,
        }
    even_split, even_step, even_stage = results["even"]
    sized_step = results["speed-sized"][1]
    speeds = measured_speeds(costs, even_split.bounds, even_stage)
    read = [Device(s, d.capacity_bytes) for s, d in zip(speeds, devices, strict=True)]
    ideal = ideal_step_seconds(costs, read, a.microbatches)
    recut = results["re-cut"][0]
    ratio = even_step / sized_step
    print(f"{emu}speed-sized over even: {ratio:.2f}x the step rate")
    print(
        f"{emu}ideal step (balanced for the speeds the even run measured: "
        + ", ".join(f"{s:.2f}" for s in speeds)
        + f") {ideal * 1e3:.0f}ms: speed-sized at {100 * ideal / sized_step:.1f}% of it, "
        f"the re-cut from them (blocks {recut.sizes}) at "
        f"{100 * ideal / results['re-cut'][1]:.1f}%"
    )
    out |= {
        "speed_sized_over_even": ratio,
        "ideal_step_s": ideal,
        "pct_of_ideal": 100 * ideal / sized_step,
        "speeds_at_start": [d.speed for d in devices],
        "speeds_read_from_even_run": list(speeds),
        "recut_blocks": list(recut.sizes),
    }
    return out


def _write(a: argparse.Namespace, raw: list[Any], summary: dict[str, Any]) -> None:
    a.out.mkdir(parents=True, exist_ok=True)
    with gzip.open(a.out / "intervals.jsonl.gz", "wt", encoding="utf-8") as fh:
        for record in raw:
            fh.write(json.dumps(record) + "\n")
    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    meta = {
        "command": "python -m hetero.bench.pipeline " + " ".join(sys.argv[1:-1]),
        "emulated": bool(a.slowdown),
        "neighbour_gpu": a.neighbour_gpu,
        "torch": torch.__version__,
        "devices": devices or ["cpu"],
        "tf32": a.device == "cuda" and not a.no_tf32,
        "time_unix_s": time.time(),
    }
    (a.out / "summary.json").write_text(json.dumps(meta | summary, indent=1) + "\n")
    print(f"raw intervals and summary written to {a.out}")


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    a = _args(given)
    if a.rank_run:
        _rank(a)
        return 0
    if len(_factors(a)) != a.stages:
        print(
            f"error: --slowdown gives {len(_factors(a))} factors for {a.stages} stages",
            file=sys.stderr,
        )
        return 2
    if a.neighbour_gpu is not None and a.device != "cuda":
        print("error: --neighbour-gpu needs --device cuda", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "hetero.bench.pipeline", *given, "--rank-run"]
    env = {"OMP_NUM_THREADS": "1"} if a.device == "cpu" else {}
    if a.neighbour_gpu is None:
        return launch_local(cmd, a.stages, extra_env=env)
    from hetero.bench.harness.neighbour import NeighbourProcess

    with tempfile.TemporaryDirectory() as tmp:
        files = Path(tmp)
        argv_n = [
            sys.executable,
            "-m",
            "hetero.bench.harness.neighbour",
            "--device",
            f"cuda:{a.neighbour_gpu}",
            "--size",
            str(a.neighbour_size),
            "--control",
            str(files / "control"),
            "--ready",
            str(files / "ready"),
        ]
        with NeighbourProcess(argv_n, files / "control", files / "ready"):
            return launch_local(cmd, a.stages, extra_env=env)


if __name__ == "__main__":
    raise SystemExit(main())
