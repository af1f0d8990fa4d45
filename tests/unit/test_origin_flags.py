"""The origin documents' launch and profiling flags on hetero-train: aliases where they mean
something here, one-line refusals with a pointer where they do not."""

from __future__ import annotations

import os

import pytest

from hetero.core.catalogue.commandline import build_parser, options_from_args
from hetero.core.errors import ConfigError
from hetero.trainer.cli import main


def parse(*argv: str):  # type: ignore[no-untyped-def]
    return options_from_args(build_parser("hetero-train", "", "").parse_args(list(argv)))


def test_num_epochs_is_epochs() -> None:
    assert parse("--num-epochs", "3").epochs == 3


def test_num_epochs_and_epochs_together_are_given_twice() -> None:
    with pytest.raises(ConfigError, match="given twice"):
        parse("--epochs", "2", "--num-epochs", "3")


def test_a_seed_documents_profiling_flags_are_accepted_with_a_run_directory() -> None:
    cfg = parse(
        "--enable-profiling", "--profile-interval", "1", "--experiment-name", "resnet_hetero"
    )
    assert cfg.name == "resnet_hetero"


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--num-nodes", "4"],
            "--num-nodes: hetero-train takes no node count: nodes come from the launcher "
            "(torchrun --nnodes, srun -N) or the coordinator; on one machine, --nproc N",
        ),
        (["--profile-interval", "5"], "every --rebalance-interval steps (give that instead)"),
        (["--enable-profiling"], "give --output-dir DIR or --name NAME to keep"),
        (["--nproc", "2", "--master-addr", "10.0.0.1"], "--nproc's ranks meet on this machine"),
    ],
)
def test_flags_that_mean_nothing_here_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main([*argv, "--model", "debug", "--steps", "1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_master_addr_and_port_become_the_rendezvous_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for variable in ("MASTER_ADDR", "MASTER_PORT"):  # unset here, restored afterwards
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)
    argv = ["--master-addr", "10.1.2.3", "--master-port", "29511", "--model", "debug"]
    assert main([*argv, "--dry-run"]) == 0
    assert os.environ["MASTER_ADDR"] == "10.1.2.3" and os.environ["MASTER_PORT"] == "29511"


def test_a_master_addr_that_contradicts_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.2")
    assert main(["--master-addr", "10.0.0.1", "--model", "debug", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --master-addr 10.0.0.1 differs from MASTER_ADDR=10.0.0.2 in the environment"
    )


def test_help_lists_the_origin_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--num-epochs", "--num-nodes", "--master-addr", "--enable-profiling"):
        assert flag in out
    assert "--profile-interval" in out
