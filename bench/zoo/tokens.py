"""The language-model scenario's preparation step: text in, a token file on disk out.

``python -m hetero.bench.zoo.tokens --out DIR/tokens.bin --tokens N [--text PATH]``
writes ``N`` token ids as a flat uint16 array (uint32 for vocabularies above
65,536) and ``tokens.bin.json`` beside it (dtype, vocabulary size, tokenizer,
count, source), which ``workloads.TokenWindows`` reads through ``np.memmap``.

Text: ``--text`` names a file, or a folder whose ``*.txt`` and ``*.md`` files
are read in name order; without it a seeded generator writes English-like
sentences from a fixed word list (a GPU host without network has no corpus to
fetch). The text repeats until there are ``N`` tokens. Tokenizer: UTF-8 bytes
(ids 0..255, no dependency, nothing to download) or, with ``--tokenizer gpt2``,
GPT-2's BPE through tiktoken when it is installed with its encoding cached.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hetero.core.errors import ConfigError

#: The generator's vocabulary: common English words and a few of the field's.
_TEXT_WORDS = """
the of and to in a is that for it as was with be by on not he this are or his from at which
but have an they you were her she there been one all we their has would when if so no will can
more out up about into than its time only could new them some these may first any like now my
such make over our even most me state after also made many did must before back see through
way where get much go well your know should down work year because come people just say each
those take day good how long little use very great model data train step batch rank device
gradient memory speed plan loader worker sample
"""
WORDS = tuple(_TEXT_WORDS.split())


def generated_text(chars: int, seed: int = 0) -> str:
    """About ``chars`` characters of sentences drawn from ``WORDS`` (seeded)."""
    rng = random.Random(seed)
    out: list[str] = []
    n = 0
    while n < chars:
        words = rng.choices(WORDS, k=rng.randint(6, 18))
        sentence = " ".join(words).capitalize() + ". "
        out.append(sentence)
        n += len(sentence)
    return "".join(out)


def read_text(path: Path) -> str:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".txt", ".md"))
        if not files:
            raise ConfigError(f"text folder {path} has no *.txt or *.md files")
        return "\n".join(f.read_text(errors="replace") for f in files)
    if not path.is_file():
        raise ConfigError(f"text {path} does not exist")
    return path.read_text(errors="replace")


def tokenize(text: str, tokenizer: str) -> tuple[list[int] | bytes, int, str]:
    """(ids, vocabulary size, description) of ``text``."""
    if tokenizer == "bytes":
        return text.encode("utf-8"), 256, "UTF-8 bytes"
    try:
        import tiktoken

        enc = tiktoken.get_encoding("gpt2")
    except Exception as exc:  # not installed, or its encoding is not cached offline
        raise ConfigError(f"--tokenizer gpt2 needs tiktoken with its encoding: {exc}") from None
    return (
        enc.encode_ordinary(text),
        int(enc.n_vocab),
        f"GPT-2 BPE (tiktoken {tiktoken.__version__})",
    )


def write_tokens(
    out: Path, count: int, *, text: Path | None = None, tokenizer: str = "bytes", seed: int = 0
) -> dict[str, object]:
    """Write ``count`` tokens to ``out`` and its header; return the header."""
    if count < 2:
        raise ConfigError(f"--tokens must be >= 2, got {count}")
    source = read_text(text) if text is not None else generated_text(min(count, 4_000_000), seed)
    ids, vocab, described = tokenize(source, tokenizer)
    if len(ids) == 0:
        raise ConfigError("the text has no tokens")
    dtype = np.uint16 if vocab <= 2**16 else np.uint32
    base = np.frombuffer(ids, dtype=np.uint8) if isinstance(ids, bytes) else np.asarray(ids)
    reps = -(-count // len(base))
    arr = np.tile(base.astype(dtype), reps)[:count]
    out.parent.mkdir(parents=True, exist_ok=True)
    arr.tofile(out)
    header: dict[str, object] = {
        "dtype": np.dtype(dtype).name,
        "vocab_size": vocab,
        "tokenizer": described,
        "count": int(count),
        "source": str(text) if text is not None else f"generated sentences (seed {seed})",
    }
    Path(f"{out}.json").write_text(json.dumps(header, indent=2) + "\n")
    return header


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hetero.bench.zoo.tokens", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="token file to write")
    p.add_argument("--tokens", type=int, required=True, help="how many token ids")
    p.add_argument("--text", type=Path, help="a text file or folder (default: generated text)")
    p.add_argument("--tokenizer", choices=("bytes", "gpt2"), default="bytes")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        header = write_tokens(
            args.out, args.tokens, text=args.text, tokenizer=args.tokenizer, seed=args.seed
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"wrote {args.out}: {header['count']:,} {header['dtype']} tokens, {header['tokenizer']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
