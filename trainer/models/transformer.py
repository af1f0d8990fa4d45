"""GPT-2 (causal LM) and BERT (masked LM) in plain torch, from a config dataclass.

No downloads and no ``transformers`` dependency: the layouts follow the papers
(GPT-2: pre-LayerNorm blocks, tied output embedding, residual projections
scaled by 1/sqrt(2·layers) at init; BERT: post-LayerNorm blocks, LayerNorm
after the embeddings, an MLM head with a transform layer and a decoder tied to
the token embedding). BERT's token-type embedding and pooler are left out: the
masked-LM objective here has a single segment and no next-sentence task.

Both take ``(N, T)`` token ids and return ``(N, T, vocab_size)`` logits. There
are no registered buffers (attention masking is ``is_causal`` in
``scaled_dot_product_attention``), so DDP has nothing to broadcast in forward.
``activation_checkpointing = True`` recomputes each block in backward instead
of keeping its activations (``trainer.models.recompute``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from hetero.core.errors import ConfigError
from hetero.trainer.models.recompute import run_block


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes of a transformer language model. Validated on construction.

    ``max_seq_len`` is the number of positions (tokens per sample at most);
    ``mask_token_id`` is the id masked-LM inputs use for hidden tokens (the
    last id of the vocabulary, so byte-level data in 0..255 never collides).
    """

    vocab_size: int
    max_seq_len: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    causal: bool = True
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    default_seq_len: int = 0  # tokens per sample when the user does not say; 0: max_seq_len

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads", "d_ff"):
            if getattr(self, name) < 1:
                raise ConfigError(f"transformer {name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def mask_token_id(self) -> int:
        return self.vocab_size - 1

    @property
    def seq_len(self) -> int:
        return self.default_seq_len or self.max_seq_len


#: The published sizes, and tiny ones for tests (byte-level vocabulary: 256 bytes,
#: plus one id for [MASK] in BERT's case).
CONFIGS: dict[str, TransformerConfig] = {
    "gpt2-small": TransformerConfig(50257, 1024, 768, 12, 12, 3072, causal=True),
    "gpt2-medium": TransformerConfig(50257, 1024, 1024, 24, 16, 4096, causal=True),
    "gpt2-large": TransformerConfig(50257, 1024, 1280, 36, 20, 5120, causal=True),
    "gpt2-tiny": TransformerConfig(256, 64, 64, 2, 4, 256, causal=True),
    "bert-base": TransformerConfig(
        30522,
        512,
        768,
        12,
        12,
        3072,
        causal=False,
        dropout=0.1,
        layer_norm_eps=1e-12,
        default_seq_len=128,
    ),
    "bert-tiny": TransformerConfig(257, 64, 64, 2, 4, 256, causal=False, layer_norm_eps=1e-12),
}


class SelfAttention(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.causal = cfg.causal
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.n_heads, c // self.n_heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=self.causal,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.proj(y.transpose(1, 2).reshape(n, t, c))


class Block(nn.Module):
    """One transformer layer; ``pre_norm`` is GPT-2's order, otherwise BERT's."""

    def __init__(self, cfg: TransformerConfig, *, pre_norm: bool) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.ln1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.out = nn.Linear(cfg.d_ff, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.gelu = "tanh" if pre_norm else "none"  # GPT-2 used the tanh approximation

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.out(F.gelu(self.fc(x), approximate=self.gelu)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.drop(self.attn(self.ln1(x)))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.drop(self.attn(x)))
        return self.ln2(x + self.mlp(x))


class _LanguageModel(nn.Module):
    """Embeddings and blocks shared by both models; subclasses add the head."""

    pre_norm: bool
    #: The attributes that run before the blocks and after them: a pipeline's first and
    #: last stage keep these alone (``hetero.trainer.pipeline``). The output layer shares
    #: ``tok_emb``'s weight, so the last stage holds a copy of it too.
    head_parts: tuple[str, ...] = ("tok_emb", "pos_emb", "drop")
    tail_parts: tuple[str, ...] = ()

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.config = cfg
        self.activation_checkpointing = False
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, pre_norm=self.pre_norm) for _ in range(cfg.n_layers))

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """``(N, T)`` token ids to ``(N, T, d_model)`` hidden states before the head."""
        t = idx.shape[1]
        if t > self.config.max_seq_len:
            raise ConfigError(
                f"sequence of {t} tokens exceeds max_seq_len {self.config.max_seq_len}"
            )
        x = self.embedded(idx)
        for block in self.blocks:
            x = run_block(self, block, x, block)
        return x

    def embedded(self, idx: torch.Tensor) -> torch.Tensor:
        """``(N, T)`` token ids to the first block's input, ``(N, T, d_model)``."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.embed(self.tok_emb(idx) + self.pos_emb(pos)))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The last block's output to ``(N, T, vocab)`` logits."""
        raise NotImplementedError

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class GPT(_LanguageModel):
    """GPT-2: causal self-attention, pre-LayerNorm, output layer tied to the token embedding."""

    pre_norm = True
    tail_parts = ("ln_f", "tok_emb")

    def __init__(self, cfg: TransformerConfig) -> None:
        if not cfg.causal:
            raise ConfigError("GPT needs a causal config")
        super().__init__(cfg)
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self._init_weights()
        # GPT-2: residual projections scaled down so the residual stream's variance
        # does not grow with depth.
        for block in self.blocks:
            assert isinstance(block, Block)
            for lin in (block.attn.proj, block.out):
                nn.init.normal_(lin.weight, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.logits(self.hidden(idx))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.ln_f(h), self.tok_emb.weight)


class BertMLM(_LanguageModel):
    """BERT with its masked-LM head: bidirectional attention, post-LayerNorm."""

    pre_norm = False
    head_parts = ("tok_emb", "pos_emb", "drop", "emb_ln")
    tail_parts = ("head_dense", "head_ln", "head_bias", "tok_emb")

    def __init__(self, cfg: TransformerConfig) -> None:
        if cfg.causal:
            raise ConfigError("BERT needs a bidirectional (causal=False) config")
        super().__init__(cfg)
        self.emb_ln = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.head_dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.head_ln = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.head_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self._init_weights()

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.emb_ln(x)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.logits(self.hidden(idx))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        h = self.head_ln(F.gelu(self.head_dense(h)))
        return F.linear(h, self.tok_emb.weight, self.head_bias)


def build_transformer(name: str, **overrides: int | float | bool) -> GPT | BertMLM:
    """A model of config ``name`` (``CONFIGS``), fields overridden by keyword."""
    cfg = replace(CONFIGS[name], **overrides)  # type: ignore[arg-type]
    return GPT(cfg) if cfg.causal else BertMLM(cfg)
