"""The built-in models: ResNet-18/50 (torchvision, untrained), the GPT family and an MLP.

GPT is the GPT-2 architecture (learned positions, pre-LayerNorm blocks, GELU MLP, output head tied to the
token embedding) with attention through ``F.scaled_dot_product_attention`` so that flash/efficient kernels
are used on GPUs; the vocabulary is GPT-2's padded to 50304 (a multiple of 64) for efficient matrix shapes.
Sizes (``GPT_PRESETS``):

- ``gpt-tiny``: two narrow layers, for CPU tests;
- ``gpt-small``: GPT-2 small, 124M parameters (12 layers, width 768, 12 heads);
- ``gpt-medium``: GPT-3 Medium / GPT-2 medium, 354M (24 layers, width 1024, 16 heads of 64);
- ``gpt-xl``: GPT-3 XL, 1.31B (24 layers, width 2048, 16 heads of 128; the GPT-3 paper's table lists 24
  heads of 128, which does not divide the width, so heads of 128 at width 2048 it is).

The context length is the dataset's ``sequenceLength`` (GPT-3 used 2048). Every model can be shaped
through ``spec.workload.config`` (camelCase keys): ``vocabSize``, ``numLayers``, ``numHeads``, ``embedDim``,
``dropout`` for GPT; ``inputDim``, ``hiddenDim``, ``numLayers`` for the MLP. Each is read through
``trainop.api.model_config`` by its ``Key``: the API refuses any key a model does not read (its table
``KEYS``), so the two lists are one. The encoders (BERT, ViT) are in ``encoders.py``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainop.api import model_config
from trainop.api.model_config import Key


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int
    num_layers: int
    num_heads: int
    embed_dim: int
    dropout: float = 0.0


GPT_PRESETS: dict[str, dict[str, int]] = {
    "gpt-tiny": {"vocab_size": 1024, "num_layers": 2, "num_heads": 4, "embed_dim": 128},
    "gpt-small": {"vocab_size": 50304, "num_layers": 12, "num_heads": 12, "embed_dim": 768},
    "gpt-medium": {"vocab_size": 50304, "num_layers": 24, "num_heads": 16, "embed_dim": 1024},
    "gpt-xl": {"vocab_size": 50304, "num_layers": 24, "num_heads": 16, "embed_dim": 2048},
}


class SelfAttention(nn.Module):
    """Multi-head self-attention; causal for decoders, bidirectional for encoders."""

    def __init__(self, config: GPTConfig, *, causal: bool = True) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.causal = causal
        self.qkv = nn.Linear(config.embed_dim, 3 * config.embed_dim)
        self.proj = nn.Linear(config.embed_dim, config.embed_dim)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        shape = (batch, length, self.num_heads, channels // self.num_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=self.causal, dropout_p=self.dropout if self.training else 0.0
        )
        out: torch.Tensor = self.proj(y.transpose(1, 2).contiguous().view(batch, length, channels))
        return out


class Block(nn.Module):
    """A pre-LayerNorm transformer block (attention, then a GELU MLP of 4x the width)."""

    def __init__(self, config: GPTConfig, *, causal: bool = True) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.embed_dim)
        self.attn = SelfAttention(config, causal=causal)
        self.ln2 = nn.LayerNorm(config.embed_dim)
        self.mlp = nn.Sequential(
            nn.Linear(config.embed_dim, 4 * config.embed_dim),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * config.embed_dim, config.embed_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    """Decoder-only transformer; ``forward(tokens[B, T]) -> logits[B, T, vocab]``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.embed_dim % config.num_heads:
            raise ValueError("embedDim must be a multiple of numHeads")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.embed_dim)
        self.position_embedding = nn.Embedding(config.block_size, config.embed_dim)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.embed_dim)
        self.head = nn.Linear(config.embed_dim, config.vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight  # tied, as in GPT-2
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections.
        for name, param in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.num_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        x = self.drop(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits


class MLP(nn.Module):
    def __init__(self, *, input_dim: int, hidden_dim: int, num_layers: int, num_classes: int) -> None:
        super().__init__()
        self.input_dim = input_dim
        layers: list[nn.Module] = []
        width = input_dim
        for _ in range(num_layers):
            layers += [nn.Linear(width, hidden_dim), nn.ReLU()]
            width = hidden_dim
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def gpt(size: str, *, block_size: int, config: dict[str, Any]) -> GPT:
    base = GPT_PRESETS[size]
    return GPT(
        GPTConfig(
            vocab_size=model_config.dimension(config, Key.VOCAB_SIZE, base["vocab_size"]),
            block_size=block_size,
            num_layers=model_config.dimension(config, Key.NUM_LAYERS, base["num_layers"]),
            num_heads=model_config.dimension(config, Key.NUM_HEADS, base["num_heads"]),
            embed_dim=model_config.dimension(config, Key.EMBED_DIM, base["embed_dim"]),
            dropout=model_config.fraction(config, Key.DROPOUT, 0.0),
        )
    )


def mlp(*, num_classes: int, config: dict[str, Any]) -> MLP:
    return MLP(
        input_dim=model_config.dimension(config, Key.INPUT_DIM, 32),
        hidden_dim=model_config.dimension(config, Key.HIDDEN_DIM, 64),
        num_layers=model_config.dimension(config, Key.NUM_LAYERS, 2),
        num_classes=num_classes,
    )


def block_names(name: str, model: nn.Module) -> tuple[str, ...]:
    """The repeated blocks of a built-in model, by module name (see ``Workload.blocks``)."""
    if isinstance(model, GPT):
        return tuple(f"blocks.{i}" for i in range(len(model.blocks)))
    if isinstance(model, MLP):
        return tuple(f"net.{i}" for i, layer in enumerate(model.net) if isinstance(layer, nn.Linear))
    if name.startswith("resnet"):
        return tuple(
            f"{stage}.{i}"
            for stage in ("layer1", "layer2", "layer3", "layer4")
            for i in range(len(getattr(model, stage)))
        )
    return ()


def resnet(name: str, *, num_classes: int) -> nn.Module:
    import torchvision

    builder = torchvision.models.resnet18 if name == "resnet18" else torchvision.models.resnet50
    model: nn.Module = builder(weights=None, num_classes=num_classes)
    return model
