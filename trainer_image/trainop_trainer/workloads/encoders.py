"""The built-in encoders: a BERT-style masked language model, and ViT-B/16 (torchvision, untrained).

``bert-base`` is BERT-base's shape (12 layers, width 768, 12 heads, MLP 3072, learned positions, GELU) with
pre-LayerNorm blocks — the GPT blocks of ``models.py`` with bidirectional attention — which train stably
without BERT's warm-up tricks; the masked-LM head (dense, GELU, LayerNorm, decoder tied to the token
embedding) predicts the masked tokens only (``masked_lm_loss``). The vocabulary defaults to BERT's 30522
padded to 30528 (a multiple of 64). Masking happens in the dataset (``datasets.MaskedTokens``), as a pure
function of the sample index, so a resumed run masks exactly what an uninterrupted one would.

``vit-b16`` is ``torchvision.models.vit_b_16`` (86M parameters at 224 px): 12 encoder layers, width 768,
patches of 16 pixels. ``spec.workload.config`` may shape both (``numLayers``, ``numHeads``, ``embedDim``,
``mlpDim`` for ViT, ``patchSize`` for ViT, ``vocabSize``/``dropout`` for BERT), which the CPU tests use.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainop.api import model_config
from trainop.api.model_config import Key
from trainop_trainer.workloads import models

IGNORE_INDEX = -100  # targets of unmasked positions: no loss there
BERT_BASE = {"vocab_size": 30528, "num_layers": 12, "num_heads": 12, "embed_dim": 768}
VIT_B16 = {"num_layers": 12, "num_heads": 12, "embed_dim": 768, "mlp_dim": 3072, "patch_size": 16}


class MaskedLM(nn.Module):
    """Bidirectional encoder with a masked-LM head: ``forward(tokens[B, T]) -> logits[B, T, V]``."""

    def __init__(self, config: models.GPTConfig) -> None:
        super().__init__()
        if config.embed_dim % config.num_heads:
            raise ValueError("spec.workload.config.embedDim must be a multiple of numHeads")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.embed_dim)
        self.position_embedding = nn.Embedding(config.block_size, config.embed_dim)
        self.ln_embedding = nn.LayerNorm(config.embed_dim)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(models.Block(config, causal=False) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.embed_dim)
        self.transform = nn.Sequential(
            nn.Linear(config.embed_dim, config.embed_dim), nn.GELU(), nn.LayerNorm(config.embed_dim)
        )
        self.decoder = nn.Linear(config.embed_dim, config.vocab_size)
        self.decoder.weight = self.token_embedding.weight  # tied, as in BERT
        self.apply(models.GPT._init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        x = self.drop(self.ln_embedding(x))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.decoder(self.transform(self.ln_f(x)))
        return logits


def masked_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the masked positions only (targets elsewhere are ``IGNORE_INDEX``)."""
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)


def bert(*, block_size: int, config: dict[str, Any]) -> MaskedLM:
    return MaskedLM(
        models.GPTConfig(
            vocab_size=model_config.dimension(config, Key.VOCAB_SIZE, BERT_BASE["vocab_size"]),
            block_size=block_size,
            num_layers=model_config.dimension(config, Key.NUM_LAYERS, BERT_BASE["num_layers"]),
            num_heads=model_config.dimension(config, Key.NUM_HEADS, BERT_BASE["num_heads"]),
            embed_dim=model_config.dimension(config, Key.EMBED_DIM, BERT_BASE["embed_dim"]),
            dropout=model_config.fraction(config, Key.DROPOUT, 0.0),
        )
    )


def vit(*, image_size: int, num_classes: int, config: dict[str, Any]) -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    patch_size = model_config.dimension(config, Key.PATCH_SIZE, VIT_B16["patch_size"])
    if image_size % patch_size:
        raise ValueError(
            f"spec.workload.dataset.imageSize {image_size} is not a multiple of the ViT patch size "
            f"{patch_size}: use a multiple (224 for vit-b16) or set spec.workload.config.patchSize"
        )
    model: nn.Module = VisionTransformer(
        image_size=image_size,
        patch_size=patch_size,
        num_layers=model_config.dimension(config, Key.NUM_LAYERS, VIT_B16["num_layers"]),
        num_heads=model_config.dimension(config, Key.NUM_HEADS, VIT_B16["num_heads"]),
        hidden_dim=model_config.dimension(config, Key.EMBED_DIM, VIT_B16["embed_dim"]),
        mlp_dim=model_config.dimension(config, Key.MLP_DIM, VIT_B16["mlp_dim"]),
        num_classes=num_classes,
    )
    return model


def block_names(model: nn.Module) -> tuple[str, ...]:
    if isinstance(model, MaskedLM):
        return tuple(f"blocks.{i}" for i in range(len(model.blocks)))
    layers = model.get_submodule("encoder.layers")
    return tuple(f"encoder.layers.{name}" for name, _ in layers.named_children())
