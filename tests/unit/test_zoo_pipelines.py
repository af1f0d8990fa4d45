"""The zoo's input pipelines: the jitter and EMULATED input-cost specs, the JPEG data path,
and the delays applied in DataLoader workers, identically in both loops."""

from __future__ import annotations

import io
import statistics
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

from hetero.bench.zoo.delays import InputCost, Jitter, parse_input_cost, parse_jitter
from hetero.bench.zoo.jpeg import JpegImages, make_jpegs
from hetero.bench.zoo.train import parse_args
from hetero.bench.zoo.workloads import Delayed, MemoryImages, build_data
from hetero.core.errors import ConfigError


def test_jitter_spec_reads_keys_or_a_bare_mean_and_names_a_bad_part() -> None:
    assert parse_jitter("mean_ms=2,sigma=1.5,stall_p=0.01,stall_ms=100") == Jitter(
        2.0, 1.5, 0.01, 100.0
    )
    assert parse_jitter("3") == Jitter(3.0)
    assert parse_jitter(None) is None and parse_jitter("") is None
    with pytest.raises(ConfigError, match="cannot parse 'spread=2'"):
        parse_jitter("mean_ms=1,spread=2")
    with pytest.raises(ConfigError, match="sigma must be a number, got 'x'"):
        parse_jitter("mean_ms=1,sigma=x")
    with pytest.raises(ConfigError, match="give stall_p and stall_ms together"):
        parse_jitter("mean_ms=1,stall_p=0.1")
    with pytest.raises(ConfigError, match="gives no mean_ms"):
        parse_jitter("sigma=1")


def test_jitter_is_a_fixed_heavy_tailed_delay_per_sample_with_the_mean_it_was_given() -> None:
    j = Jitter(mean_ms=2.0, sigma=1.2, stall_p=0.01, stall_ms=50.0)
    delays = [j.delay_s(7, i) for i in range(20_000)]
    assert delays[:50] == [j.delay_s(7, i) for i in range(50)]  # seeded by (seed, index)
    assert delays[:50] != [j.delay_s(8, i) for i in range(50)]
    # Mean 2 ms of lognormal plus 1% of 50 ms stalls: 2.5 ms (20,000 draws, fixed seed).
    assert statistics.fmean(delays) == pytest.approx(2.5e-3, rel=0.05)
    assert statistics.median(delays) < 1.5e-3  # heavy-tailed: the median far below the mean
    assert sum(d > 0.05 for d in delays) == pytest.approx(200, rel=0.2)
    assert "p99" in j.describe() and "stalls of 50 ms" in j.describe()


def test_input_cost_is_per_rank_or_every_rank_and_says_it_is_emulated() -> None:
    every = parse_input_cost("2.5")
    assert every == InputCost(every_rank_ms=2.5) and every.ms_for(3) == 2.5
    ranks = parse_input_cost("1:6,0:1")
    assert ranks is not None and (ranks.ms_for(0), ranks.ms_for(1), ranks.ms_for(2)) == (1, 6, 0)
    assert ranks.describe().startswith("EMULATED input cost") and "rank 1 6 ms" in ranks.describe()
    for bad in ("1:x", "a", "1:2,1:3", "-1:2", "0:20000"):
        with pytest.raises(ConfigError, match="input cost"):
            parse_input_cost(bad)


def test_jpeg_files_are_distinct_photo_sized_and_the_same_from_the_same_seed() -> None:
    files = make_jpegs(6, seed=3, min_side=64, max_side=96)
    assert files == make_jpegs(6, seed=3, min_side=64, max_side=96)
    assert len(set(files)) == 6 and files != make_jpegs(6, seed=4, min_side=64, max_side=96)
    for f in files:
        with Image.open(io.BytesIO(f)) as im:
            assert im.format == "JPEG" and all(64 <= s <= 96 for s in im.size)
    with pytest.raises(ConfigError, match="jpeg sides"):
        make_jpegs(1, min_side=300, max_side=200)


def test_jpeg_samples_are_decoded_cropped_and_normalised_per_access() -> None:
    data = JpegImages(40, 32, 5, bank_size=4, min_side=48, max_side=64)
    assert len(data) == 40 and len(data.files) == 4
    x, y = data[6]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and int(y) == 2  # file 2
    assert -3.0 < float(x.mean()) < 3.0  # normalised, not 0..255
    torch.manual_seed(0)
    a = data[1][0]
    torch.manual_seed(1)
    assert not torch.equal(a, data[1][0])  # a random crop each time, as in training
    assert "4 JPEG files" in data.describe() and "RandomResizedCrop(32)" in data.describe()


def test_delays_wrap_the_samples_unchanged_and_run_in_the_dataloaders_workers() -> None:
    source = TensorDataset(torch.arange(16.0), torch.arange(16) % 3)
    delayed = Delayed(source, jitter=Jitter(0.2), input_cost_s=1e-4, seed=0)
    loader = DataLoader(delayed, batch_size=4, num_workers=1, shuffle=False)
    xs = torch.cat([x for x, _ in loader])
    assert len(delayed) == 16 and torch.equal(xs, torch.arange(16.0))


def test_delays_need_a_dataloader_path_and_jpeg_needs_images() -> None:
    args = parse_args(["--data", "device", "--loader-jitter", "1", "--num-samples", "8"])
    common = {"num_samples": 8, "image_size": 8, "num_classes": 3, "tokens": None, "seq_len": 8}
    with pytest.raises(ConfigError, match="act in DataLoader workers: use --data loader or jpeg"):
        build_data("simple_cnn", path=args.data, jitter=parse_jitter(args.loader_jitter), **common)
    dataset, line = build_data(
        "simple_cnn", path="loader", rank=1, input_cost=parse_input_cost("1:2"), **common
    )
    assert isinstance(dataset, Delayed) and dataset.input_cost_s == pytest.approx(2e-3)
    assert "EMULATED input cost" in line()
    plain, _ = build_data("simple_cnn", path="loader", rank=0, input_cost=InputCost(), **common)
    assert isinstance(plain, MemoryImages)  # nothing to add on this rank
    with pytest.raises(ConfigError, match="the jpeg data path is for images"):
        build_data("gpt2-tiny", path="jpeg", **(common | {"tokens": Path("tokens.bin")}))
