"""``hetero-train``'s command line, derived from the option descriptions.

Every option ``TrainingOptions`` offers on the command line becomes a flag
(``--global-batch N``; booleans ``--channels-last`` / ``--no-channels-last``)
with its help, default and bounds; :func:`options_from_args` turns the flags a
user gave into a validated ``TrainingOptions``, an error naming the flag the
user typed. The origin documents' flags (:data:`ORIGIN_FLAGS`) are accepted as
aliases. :func:`argv_for` is the way back: an agent turns a launch order's
option map into these flags without knowing what any option means.

Standard library only (``argparse``), so ``hetero-train --help`` and the agent
need no torch.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from hetero.core.catalogue.kinds import Bool, Choice, Switch
from hetero.core.catalogue.options import Entry, Option, OptionError
from hetero.core.catalogue.training import BY_NAME, OPTIONS, TrainingOptions
from hetero.core.errors import ConfigError

GROUPS = {
    "job": "job",
    "length": "length and batch",
    "memory": "precision and memory",
    "balancing": "balancing",
    "processes": "processes",
    "output": "output",
}

#: The flags people arriving from the origin documents type, and what they become
#: (the migration table of docs/trainer.md is written from this).
ORIGIN_FLAGS: tuple[tuple[str, str, str], ...] = (
    (
        "--batch-size B",
        "`--batch-size B`: B samples per rank, a global batch of B × ranks",
        "`batch_size: B`",
    ),
    ("--epochs N", "`--epochs N`: N passes over the dataset's real size", "`epochs: N`"),
    ("--num-epochs N", "`--epochs N`", "`epochs: N`"),
    (
        "--master-addr HOST --master-port PORT",
        "`MASTER_ADDR`, `MASTER_PORT` of a rank started by hand (torchrun sets them; "
        "`--nproc` ranks meet on 127.0.0.1)",
        "(the coordinator chooses them)",
    ),
    (
        "--enable-profiling",
        "always on: every step of every rank is timed; `--output-dir` or `--name` keeps "
        "the figures (DIR/metrics)",
        "always on",
    ),
    (
        "--profile-interval 1",
        "always so; the figures are written every `--rebalance-interval` steps (another "
        "value is refused)",
        "`rebalance_interval: N`",
    ),
    (
        "--num-nodes N",
        "refused: nodes come from the launcher (`torchrun --nnodes`, `srun -N`)",
        "(the coordinator places ranks on its agents' nodes)",
    ),
    (
        "--gpu-profiles FILE.json",
        "`--gpu-profiles FILE.json`: the ranks' compute scores from the file",
        "(the agents measure the nodes)",
    ),
    ("--experiment-name NAME", "`--name NAME`: the summary, metrics and runs/NAME", "`name: NAME`"),
    ("--enable-load-balancing --load-balance-policy P", "`--policy P`", "`policy: P`"),
    (
        "--load-balance-policy P without --enable-load-balancing",
        "`--policy equal`",
        "`policy: equal`",
    ),
    ("--dataset synthetic_image", "`--dataset synthetic`", "`dataset: synthetic`"),
)

_ENABLE = "origin_enable_load_balancing"
_ORIGIN_POLICY = "origin_load_balance_policy"
_NUM_NODES = "origin_num_nodes"
_PROFILING = "origin_enable_profiling"
_PROFILE_INTERVAL = "origin_profile_interval"
#: ``--master-addr`` / ``--master-port``: the rendezvous variables they stand for.
RENDEZVOUS_FLAGS = {"--master-addr": "MASTER_ADDR", "--master-port": "MASTER_PORT"}


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (``error: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            words = message.split(":", 1)[1].split()
            flag = next((w.split("=")[0] for w in words if w.startswith("--")), "")
            known = [s for a in self._actions for s in a.option_strings]
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag else []
            if close:
                message += f" (did you mean {close[0]}?)"
        print(f"error: {message} ({self.prog} --help lists every flag)", file=sys.stderr)
        raise SystemExit(2)


def cli_options() -> tuple[Option, ...]:
    return tuple(o for o in OPTIONS if Entry.CLI in o.where)


def build_parser(prog: str, description: str, epilog: str) -> argparse.ArgumentParser:
    """A parser with a flag per option; every default is left out of the namespace, so
    :func:`options_from_args` knows what the user gave."""
    p = _Parser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    groups = {key: p.add_argument_group(title) for key, title in GROUPS.items()}
    for option in cli_options():
        group = groups[option.group]
        text = _help(option)
        if isinstance(option.kind, Bool):
            group.add_argument(
                option.flag, dest=option.name, action=argparse.BooleanOptionalAction, help=text
            )
        elif isinstance(option.kind, Switch):  # the bare flag is on, as when it was a Bool
            group.add_argument(
                option.flag,
                dest=option.name,
                nargs="?",
                const="on",
                metavar="auto|on|off",
                help=text,
            )
            group.add_argument(
                "--no-" + option.flag[2:],
                dest=option.name,
                action="store_const",
                const="off",
                help=f"the same as {option.flag} off",
            )
        else:
            group.add_argument(
                option.flag, dest=option.name, metavar=option.kind.metavar(), help=text
            )
        for alias in option.aliases:
            group.add_argument(
                alias,
                dest=f"alias_{option.name}",
                metavar=option.kind.metavar(),
                help=f"the same as {option.flag} (origin documents)",
            )
    policy = BY_NAME["policy"]
    groups["balancing"].add_argument(
        "--enable-load-balancing",
        dest=_ENABLE,
        action="store_true",
        help="origin documents: balance with --load-balance-policy (else --policy equal)",
    )
    groups["balancing"].add_argument(
        "--load-balance-policy",
        dest=_ORIGIN_POLICY,
        metavar=policy.kind.metavar(),
        help="origin documents: the policy with --enable-load-balancing",
    )
    origin = p.add_argument_group("origin documents' launch and profiling flags")
    origin.add_argument(
        "--num-nodes",
        dest=_NUM_NODES,
        metavar="N",
        help="refused: nodes come from the launcher (torchrun --nnodes, srun -N) or the "
        "coordinator; on one machine, --nproc N",
    )
    for flag, variable in RENDEZVOUS_FLAGS.items():
        origin.add_argument(
            flag,
            dest=_rendezvous_dest(flag),
            metavar=variable.split("_")[1],
            help=f"{variable} of a rank started by hand (torchrun and --nproc set it)",
        )
    origin.add_argument(
        "--enable-profiling",
        dest=_PROFILING,
        action="store_true",
        help="always on: every step is timed; keep the figures with --output-dir or --name",
    )
    origin.add_argument(
        "--profile-interval",
        dest=_PROFILE_INTERVAL,
        metavar="1",
        help="1 only (every step, always so); figures are written every --rebalance-interval",
    )
    return p


def _rendezvous_dest(flag: str) -> str:
    return "origin_" + flag[2:].replace("-", "_")


def rendezvous_from_args(args: argparse.Namespace) -> dict[str, str]:
    """``--master-addr`` / ``--master-port`` as the environment variables they stand for."""
    found = vars(args)
    return {
        variable: str(found[_rendezvous_dest(flag)])
        for flag, variable in RENDEZVOUS_FLAGS.items()
        if _rendezvous_dest(flag) in found
    }


def _help(option: Option) -> str:
    text = option.help_for(Entry.CLI)
    if isinstance(option.kind, Choice) and len(option.kind.choices) > 6:
        text += f"; one of {', '.join(option.kind.choices)}"
    if (
        option.default is not None and not (isinstance(option.kind, Bool) and not option.default)
    ) or option.default_doc is not None:
        text += f" (default: {option.default_words(Entry.CLI)})"
    return text.replace("`", "").replace("%", "%%")


def options_from_args(args: argparse.Namespace) -> TrainingOptions:
    """The options the user gave as a validated ``TrainingOptions``; a bad value is a
    ``ConfigError`` naming the flag as typed (``--experiment-name``, not ``--name``)."""
    given: dict[str, Any] = {}
    typed: dict[str, str] = {}
    found = vars(args)
    for option in cli_options():
        for spelling, dest in (
            (option.flag, option.name),
            *((a, f"alias_{option.name}") for a in option.aliases),
        ):
            if dest not in found:
                continue
            if option.name in given:
                raise ConfigError(f"{spelling}: given twice ({typed[option.name]} and {spelling})")
            raw = found[dest]
            typed[option.name] = spelling
            try:
                given[option.name] = raw if isinstance(raw, bool) else option.from_text(raw)
            except OptionError as exc:
                raise exc.spelled(lambda n: typed.get(n, BY_NAME[n].flag)) from None
    typed_policy = _origin_policy(found, given, typed)
    if typed_policy is not None:
        given["policy"], typed["policy"] = typed_policy
    try:
        options = TrainingOptions(**given)
    except OptionError as exc:
        raise exc.spelled(lambda n: typed.get(n, BY_NAME[n].flag)) from None
    _origin_launch_and_profiling(found, options)
    return options


def _origin_launch_and_profiling(found: Mapping[str, Any], options: TrainingOptions) -> None:
    """The origin documents' flags with no option of their own: refused with a pointer to
    what does their work here, or accepted where hetero already does what they asked."""
    if _NUM_NODES in found:
        raise ConfigError(
            "--num-nodes: hetero-train takes no node count: nodes come from the launcher "
            "(torchrun --nnodes, srun -N) or the coordinator; on one machine, --nproc N"
        )
    interval = found.get(_PROFILE_INTERVAL)
    if interval is not None and interval.strip() != "1":
        raise ConfigError(
            f"--profile-interval {interval}: every step is timed; the figures are written "
            f"every --rebalance-interval steps (give that instead)"
        )
    if found.get(_PROFILING) and options.run_dir is None:
        raise ConfigError(
            "--enable-profiling: every step is always timed; give --output-dir DIR or "
            "--name NAME to keep the per-interval figures (DIR/metrics)"
        )


def _origin_policy(
    found: Mapping[str, Any], given: Mapping[str, Any], typed: Mapping[str, str]
) -> tuple[str, str] | None:
    """``--enable-load-balancing --load-balance-policy P`` is ``--policy P``; the policy
    flag without the switch is ``--policy equal`` (no balancing), as the origin documents
    have it."""
    enabled = bool(found.get(_ENABLE))
    raw = found.get(_ORIGIN_POLICY)
    if raw is None and not enabled:
        return None
    if raw is None:
        return None  # balancing on, policy as --policy says (or its default)
    policy = BY_NAME["policy"]
    try:
        value = policy.from_text(raw)
    except OptionError as exc:
        raise exc.spelled(lambda n: "--load-balance-policy") from None
    chosen = value if enabled else "equal"
    if "policy" in given and given["policy"] != chosen:
        raise OptionError(
            "policy", f"give either {typed['policy']} or --load-balance-policy, not both"
        ).spelled(lambda n: typed["policy"])
    return chosen, "--load-balance-policy"


# ---- the way back: a launch order's options as flags ------------------------------------


def option_texts(options: TrainingOptions, names: Sequence[str]) -> dict[str, str]:
    """``names``' values in the text form ``hetero-train`` reads (unset ones left out)."""
    out = {}
    for name in names:
        value = getattr(options, name)
        if value is not None:
            out[name] = BY_NAME[name].to_text(value)
    return out


def argv_for(texts: Mapping[str, str]) -> list[str]:
    """``hetero-train`` flags for an option map (``{"amp": "bf16"}`` → ``--amp bf16``; a
    value that starts with ``-`` as ``--max-batch=-,64``, which argparse cannot take apart).

    Needs no knowledge of what an option means: a name this install does not know is
    passed under the catalogue's spelling rule (``--`` and dashes), and the rank's
    ``hetero-train``, of the same install, refuses it with a one-line error naming it.
    """
    argv: list[str] = []
    for name, text in sorted(texts.items()):
        option = BY_NAME.get(name)
        flag = option.flag if option is not None else "--" + name.replace("_", "-")
        if option is not None and isinstance(option.kind, Bool):
            argv.append(flag if option.from_text(text) else "--no-" + flag[2:])
        elif text.startswith("-"):
            argv.append(f"{flag}={text}")
        else:
            argv += [flag, text]
    return argv
