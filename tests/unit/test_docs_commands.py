"""The commands README.md and docs/*.md show, run as shown on CPU, with their output compared
to what the docs print; a difference is named, not just failed on.

Checked here: every ``$ hetero-train ...`` line of a fenced block and the lines shown after
it; the README's ``hetero-train`` command (run with ``--dry-run``: it would train 200
steps); the flags the README names, against ``hetero-train --help``; the README's own loop,
executed as written on a small regression; and docs/jobspec.md's ``command:`` example,
parsed as a job file and compared with the script it runs.
"""

from __future__ import annotations

import io
import re
import shlex
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from hetero.core.jobspec import parse_jobspec
from hetero.trainer.cli import main

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _blocks(path: Path) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def _shown_runs() -> list[tuple[str, str, list[str]]]:
    """(document, command, the output lines shown after it) for each ``$ hetero-train``."""
    runs = []
    for path in DOCS:
        for block in _blocks(path):
            lines = block.splitlines()
            for i, line in enumerate(lines):
                if not line.startswith("$ hetero-train "):
                    continue
                shown = []
                for after in lines[i + 1 :]:
                    if after.startswith("$ "):
                        break
                    shown.append(after)
                runs.append((path.name, line[2:], shown))
    return runs


def _hetero_train(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    try:
        code = main(argv)
    except SystemExit as exc:  # --help
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, (captured.out + captured.err).splitlines()


def test_the_docs_show_hetero_train_commands() -> None:
    assert {doc for doc, _, _ in _shown_runs()} >= {"README.md", "trainer.md"}


@pytest.mark.parametrize(("doc", "command", "shown"), _shown_runs())
def test_a_shown_hetero_train_command_prints_what_the_docs_show(
    doc: str, command: str, shown: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, printed = _hetero_train(shlex.split(command)[1:], capsys)
    assert code == 0, f"{doc}: `{command}` exited {code}: {printed}"
    for want, got in zip(shown, printed, strict=False):
        assert got == want, f"{doc}: `{command}` printed\n  {got}\nwhere the docs show\n  {want}"
    assert len(printed) == len(shown), f"{doc}: `{command}` printed {printed}, docs show {shown}"


def test_the_readmes_hetero_train_command_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Built-in jobs: `hetero-train`") :]
    block = _blocks_of(section)[0]
    command = shlex.split(block.replace("\\\n", " "))
    assert Path(command[0]).name == "hetero-train"
    code, printed = _hetero_train([*command[1:], "--dry-run"], capsys)
    assert code == 0 and printed[0].startswith("dry run: "), f"README: {block} -> {printed}"


def _blocks_of(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, re.S)


def test_every_flag_the_readme_names_is_in_hetero_train_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Built-in jobs") : readme.index("## The pieces")]
    named = set(re.findall(r"(--[a-z][a-z-]+)", section))
    _, printed = _hetero_train(["--help"], capsys)
    text = "\n".join(printed)
    missing = sorted(flag for flag in named if flag not in text)
    assert not missing, f"README.md names {missing}, which hetero-train --help does not list"


def test_the_readmes_own_loop_runs_as_written() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Use it in your own loop") :]
    code = _blocks_of(section)[0]
    torch.manual_seed(0)
    x = torch.randn(1024, 4)
    names: dict[str, Any] = {
        "model": torch.nn.Linear(4, 1),
        "dataset": TensorDataset(x, x.sum(1, keepdim=True)),
        "loss_fn": torch.nn.functional.mse_loss,
    }
    code = code.replace(
        "for x, y in loader:",
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\nfor x, y in loader:",
    )
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile("import torch\n" + code, "README.md", "exec"), names)
    names["ctx"].close()
    assert out.getvalue().startswith("hetero: dynamic, 1 ranks, global batch 512, 2 steps"), (
        out.getvalue()
    )


def test_jobspecs_command_example_parses_and_agrees_with_its_script() -> None:
    text = (REPO / "docs" / "jobspec.md").read_text(encoding="utf-8")
    section = text[text.index("## A `command:` job") : text.index("## Examples")]
    yaml = next(b for b in _blocks_of(section) if b.startswith("name:"))
    spec = parse_jobspec(yaml, "docs/jobspec.md")
    argv = list(spec.command)
    # The job file's terms reach the script as ctx.job: no flag restates them.
    assert not {"--global-batch", "--steps"} & set(argv), argv
    script = (REPO / "examples" / Path(argv[1]).name).read_text(encoding="utf-8")
    assert "ctx.job" in script and "ctx.loader(make_data(), None if job else" in script
    init = re.search(r"ht\.init\(([^)]*)\)", script)
    assert init is not None and "policy" not in init[1] and "rebalance" not in init[1], (
        "examples/custom_loop.py: ht.init must take the job's policy and interval"
    )
    assert "not queued" not in text, "docs/jobspec.md still says jobs are not queued"
