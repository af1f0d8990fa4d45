"""Token datasets for the language models: synthetic sequences and a local text file.

Both yield raw windows of ``seq_len + 1`` token ids (``int64``); the task
wrappers at the bottom turn a window into ``(input, target)``:

- :class:`CausalLMSamples`: input = window[:-1], target = window[1:].
- :class:`MaskedLMSamples`: input = window[:-1] with ~15% of positions hidden
  (80% ``[MASK]``, 10% a random token, 10% unchanged, as in BERT), target = the
  original token at hidden positions and -100 elsewhere. Which positions are
  hidden is a fixed function of (seed, sample index, position): the same sample
  is masked the same way on every rank, in every epoch and in a retried step.
  Every sample has at least one hidden position.

Every dataset here has ``get_batch(indices, device)``, so the trainer gathers
whole batches with one indexing operation instead of a DataLoader.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from hetero.core.errors import ConfigError

IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index


def _device_indices(indices: list[int], device: torch.device) -> torch.Tensor:
    idx = torch.tensor(indices, dtype=torch.long)
    if device.type == "cuda":
        # Pinned + non_blocking: the host need not wait for the GPU (see SyntheticImages).
        return idx.pin_memory().to(device, non_blocking=True)
    return idx


class _Windows(Dataset[torch.Tensor]):
    """Rows of a ``(num_windows, seq_len + 1)`` token table, cached per device."""

    windows: torch.Tensor
    vocab_size: int

    def __init__(self) -> None:
        self._device_cache: dict[str, torch.Tensor] = {}

    @property
    def seq_len(self) -> int:
        return int(self.windows.shape[1]) - 1

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.windows[index % len(self.windows)].long()

    def get_batch(self, indices: list[int], device: torch.device) -> torch.Tensor:
        key = str(device)
        if key not in self._device_cache:
            self._device_cache[key] = self.windows.to(device)
        table = self._device_cache[key]
        idx = _device_indices(indices, device).remainder_(len(table))
        return table.index_select(0, idx).long()


class SyntheticText(_Windows):
    """Deterministic, learnable token sequences.

    A fixed random Markov chain over ``vocab_size`` tokens in which every token
    has ``branching`` possible successors: a model that learns the chain
    reaches a loss of ln(branching) per token (0.69 for 2) from ln(vocab_size)
    at the start (5.55 for 256). ``bank_size`` sequences are drawn once from
    ``seed``; sample ``i`` is sequence ``i mod bank_size``, so the same index is
    the same sample on every rank.
    """

    def __init__(
        self,
        num_samples: int = 4096,
        seq_len: int = 64,
        vocab_size: int = 256,
        *,
        seed: int = 0,
        bank_size: int = 1024,
        branching: int = 2,
    ) -> None:
        super().__init__()
        if seq_len < 1 or vocab_size < 2 or num_samples < 1:
            raise ConfigError(
                f"synthetic text needs seq_len >= 1, vocab >= 2 and samples >= 1, got "
                f"{seq_len}, {vocab_size}, {num_samples}"
            )
        g = torch.Generator().manual_seed(seed)
        self.num_samples = num_samples
        self.vocab_size = vocab_size
        successors = torch.randint(0, vocab_size, (vocab_size, branching), generator=g)
        n = min(bank_size, num_samples)
        tokens = torch.empty(n, seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, vocab_size, (n,), generator=g)
        choice = torch.randint(0, branching, (n, seq_len), generator=g)
        for t in range(seq_len):
            tokens[:, t + 1] = successors[tokens[:, t], choice[:, t]]
        self.windows = tokens

    def __len__(self) -> int:
        return self.num_samples


class ByteText(_Windows):
    """A local text file as bytes (token ids 0..255), cut into fixed windows.

    ``path`` is a file, or a directory whose ``*.txt`` files are concatenated
    in name order. Sample ``i`` is bytes ``[i·seq_len, (i+1)·seq_len]``
    (``seq_len + 1`` bytes, consecutive windows overlap by one byte, the
    target of the last position). Nothing is fetched from anywhere.
    """

    vocab_size = 256

    def __init__(self, path: str | Path, seq_len: int) -> None:
        super().__init__()
        root = Path(path)
        if root.is_dir():
            files = sorted(root.glob("*.txt"))
            if not files:
                raise ConfigError(f"text directory {str(root)!r} has no *.txt files")
        elif root.is_file():
            files = [root]
        else:
            raise ConfigError(f"text data {str(root)!r} does not exist")
        data = b"".join(f.read_bytes() for f in files)
        if len(data) < seq_len + 1:
            raise ConfigError(
                f"text data {str(root)!r} has {len(data)} bytes, fewer than one sample of "
                f"{seq_len + 1} (--seq-len + 1)"
            )
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        # unfold: a strided view, one row per window, no copy until .to(device).
        self.windows = raw.unfold(0, seq_len + 1, seq_len)

    def __len__(self) -> int:
        return len(self.windows)


def _hash_uniform(a: torch.Tensor, b: torch.Tensor, salt: int) -> torch.Tensor:
    """Floats in [0, 1) as a fixed function of integer tensors ``a``, ``b`` (broadcast).

    Integer mixing kept below 2**62 so int64 never overflows, on any device.
    """
    x = (a * 1_000_003 + b * 7_919 + salt * 104_729) & 0x7FFFFFFF
    for _ in range(3):
        x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & 0x7FFFFFFF
    return x.double() / float(2**31)


class _TaskSamples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Turns windows into ``(input, target)`` pairs; subclasses say how."""

    def __init__(self, windows: _Windows) -> None:
        self.base = windows

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def pairs(self, windows: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.pairs(self.base[index].unsqueeze(0), torch.tensor([index]))
        return x[0], y[0]

    def get_batch(
        self, indices: list[int], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        windows = self.base.get_batch(indices, device)
        return self.pairs(windows, _device_indices(indices, device))


class CausalLMSamples(_TaskSamples):
    """Next-token prediction: every position predicts the following token."""

    def pairs(self, windows: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return windows[:, :-1], windows[:, 1:]


class MaskedLMSamples(_TaskSamples):
    """BERT's masked-token prediction, with masking fixed per sample (see module doc)."""

    def __init__(
        self,
        windows: _Windows,
        *,
        mask_token_id: int,
        vocab_size: int,
        seed: int = 0,
        mask_prob: float = 0.15,
    ) -> None:
        super().__init__(windows)
        if windows.vocab_size > mask_token_id:
            raise ConfigError(
                f"data uses token ids up to {windows.vocab_size - 1}, which reach the model's "
                f"[MASK] id {mask_token_id}"
            )
        self.mask_token_id = mask_token_id
        self.data_vocab = windows.vocab_size
        self.seed = seed
        self.mask_prob = mask_prob

    def pairs(self, windows: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = windows[:, :-1]
        n, t = tokens.shape
        sample = idx.view(n, 1)
        pos = torch.arange(t, device=tokens.device).view(1, t)
        hidden = _hash_uniform(sample, pos, self.seed) < self.mask_prob
        # At least one hidden position per sample, so every sample's loss is defined.
        forced = (_hash_uniform(sample, torch.zeros_like(sample), self.seed + 1) * t).long()
        hidden.scatter_(1, forced, True)
        how = _hash_uniform(sample, pos, self.seed + 2)
        rand_tok = (_hash_uniform(sample, pos, self.seed + 3) * self.data_vocab).long()
        inputs = torch.where(hidden & (how < 0.8), self.mask_token_id, tokens)
        inputs = torch.where(hidden & (how >= 0.8) & (how < 0.9), rand_tok, inputs)
        targets = torch.where(hidden, tokens, IGNORE_INDEX)
        return inputs, targets
