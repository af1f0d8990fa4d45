"""The docs' tables of models, datasets, policies and options, written from the catalogue.

``docs/jobspec.md`` and ``docs/trainer.md`` hold generated blocks between
``<!-- generated: NAME -->`` and ``<!-- end: NAME -->``; a test checks the
committed text matches, so a table cannot drift from the code::

    python -m hetero.core.catalogue.reference --write   # from the repository root
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from hetero.core.catalogue.commandline import ORIGIN_FLAGS
from hetero.core.catalogue.entries import DATASET_ALIASES, DATASETS, MODELS, POLICIES
from hetero.core.catalogue.options import Entry, Option
from hetero.core.catalogue.training import OPTIONS


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(option: Option, entry: Entry) -> str:
    if entry is Entry.YAML and option.yaml_default is not None:
        return option.yaml_default
    if option.default is None and option.default_doc is None:
        return "—"
    words = option.default_words(entry)
    return words if "`" in words or " " in words else f"`{words}`"


def yaml_options() -> str:
    """Every job.yaml key the catalogue gives, with its type and bounds, default and meaning."""
    from hetero.core.jobspec import CLUSTER_FIELDS

    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for o in OPTIONS:
        if Entry.YAML in o.where:
            kind = o.yaml_type or o.kind.describe()
            rows.append(
                f"| `{o.key}` | {_cell(kind)} | {_cell(_default(o, Entry.YAML))} "
                f"| {_cell(o.help_for(Entry.YAML))} |"
            )
    for key, kind, default, meaning in CLUSTER_FIELDS:
        rows.append(f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(meaning)} |")
    return "\n".join(rows)


def three_ways() -> str:
    """Each option as hetero-train, job.yaml and Python spell it, with its one default."""
    rows = [
        "| option | `hetero-train` | job.yaml | `ht.train` | `ht.init` | default |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for o in OPTIONS:
        cli = f"`{o.flag}`" if Entry.CLI in o.where else "—"
        if o.aliases and Entry.CLI in o.where:
            cli += ", " + ", ".join(f"`{a}`" for a in o.aliases)
        yaml = f"`{o.key}`" if Entry.YAML in o.where else "—"
        api = "—"
        if Entry.API in o.where:
            api = f"`{o.name}=`" + (" (both)" if o.init else " (`train`)")
        rows.append(f"| {o.name} | {cli} | {yaml} | {api} | {_cell(_default(o, Entry.API))} |")
    rows.append("")
    rows.append("Where an entry point lacks an option, this is why:")
    rows.append("")
    for o in OPTIONS:
        if o.where != frozenset(Entry):
            missing = ", ".join(e.value for e in Entry if e not in o.where)
            rows.append(f"- **{o.name}** (not in {missing}): {o.absent}")
    return "\n".join(rows)


def models() -> str:
    rows = ["| model | kind | task | default size | notes |", "| --- | --- | --- | --- | --- |"]
    for m in MODELS:
        unit = "tokens" if m.kind == "text" else "px"
        limit = f", at most {m.max_seq_len} tokens" if m.max_seq_len else ""
        rows.append(
            f"| `{m.name}` | {m.kind} | {m.task} | {m.default_size} {unit}{limit} | {m.summary} |"
        )
    return "\n".join(rows)


def datasets() -> str:
    aliases = {v: k for k, v in DATASET_ALIASES.items()}
    rows = [
        "| dataset | kind | `data_dir` | samples per epoch | what |",
        "| --- | --- | --- | --- | --- |",
    ]
    for d in DATASETS:
        also = f" (also `{aliases[d.name]}`)" if d.name in aliases else ""
        rows.append(
            f"| `{d.name}`{also} | {d.kind} | {'required' if d.needs_data_dir else 'not used'} "
            f"| {d.size} | {d.summary} |"
        )
    return "\n".join(rows)


def policies() -> str:
    rows = ["| policy | what it does |", "| --- | --- |"]
    rows += [f"| `{p.name}` | {p.summary} |" for p in POLICIES]
    return "\n".join(rows)


def migration() -> str:
    rows = ["| origin documents | `hetero-train` | job.yaml |", "| --- | --- | --- |"]
    rows += [f"| `{old}` | {cli} | {yaml} |" for old, cli, yaml in ORIGIN_FLAGS]
    return "\n".join(rows)


#: Generated block name → (document, writer).
BLOCKS: dict[str, tuple[str, Callable[[], str]]] = {
    "jobspec-options": ("docs/jobspec.md", yaml_options),
    "models": ("docs/jobspec.md", models),
    "datasets": ("docs/jobspec.md", datasets),
    "policies": ("docs/jobspec.md", policies),
    "three-ways": ("docs/trainer.md", three_ways),
    "migration": ("docs/trainer.md", migration),
}


def render(text: str, doc: str) -> str:
    """``text`` with each generated block of ``doc`` rewritten."""
    for name, (where, write) in BLOCKS.items():
        if where != doc:
            continue
        pattern = re.compile(
            rf"(<!-- generated: {re.escape(name)} [^>]*-->\n)(?:.*?\n)??(<!-- end: {re.escape(name)} -->)",
            re.S,
        )
        if not pattern.search(text):
            raise SystemExit(f"{doc}: no generated block {name!r}")
        table = write()
        text = pattern.sub(lambda m: f"{m.group(1)}{table}\n{m.group(2)}", text)  # noqa: B023
    return text


def stale(root: Path) -> list[str]:
    """The documents under ``root`` whose generated blocks differ from the catalogue."""
    docs = sorted({doc for doc, _ in BLOCKS.values()})
    return [
        doc for doc in docs if render((root / doc).read_text(), doc) != (root / doc).read_text()
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the repository (default: .)")
    p.add_argument("--write", action="store_true", help="rewrite the blocks (else: check)")
    args = p.parse_args(argv)
    if not args.write:
        out = stale(args.root)
        for doc in out:
            print(f"{doc}: generated tables are stale; run with --write", file=sys.stderr)
        return 1 if out else 0
    for doc in sorted({doc for doc, _ in BLOCKS.values()}):
        path = args.root / doc
        path.write_text(render(path.read_text(), doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
