"""A small decoder-only LM whose blocks take any registered mixer (and hybrids of them).

``logits, states = model(tokens, states=None)``: tokens [B, T] int64 -> logits [B, T, V], and one
mixer state per block. Passing ``states`` back continues every lane where it stopped.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from ovq_cl.config import ModelConfig, model_config
from ovq_cl.layers import Mixer, build_mixer
from ovq_cl.state import MixerState

States = List[Optional[MixerState]]


class MLP(nn.Module):
    def __init__(self, d_model: int, ratio: float) -> None:
        super().__init__()
        hidden = max(1, int(round(d_model * ratio)))
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm block: x + mixer(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, mixer: Mixer, d_model: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(d_model)
        self.mixer = mixer
        self.norm2 = nn.RMSNorm(d_model)
        self.mlp = MLP(d_model, mlp_ratio)

    def forward(self, x: torch.Tensor, state: Optional[MixerState]) -> Tuple[torch.Tensor, MixerState]:
        h, state = self.mixer(self.norm1(x), state)
        x = x + h
        return x + self.mlp(self.norm2(x)), state


class DecoderLM(nn.Module):
    """Embedding -> blocks -> RMSNorm -> head (tied to the embedding unless configured otherwise)."""

    def __init__(self, config: Optional[ModelConfig] = None, **overrides) -> None:
        super().__init__()
        if config is None or overrides:
            base = {} if config is None else config
            config = model_config(base) if not overrides else model_config(_merge(base, overrides))
        self.config = config
        if config.vocab_size < 1 or config.d_model < 1:
            raise ValueError(f"model config: vocab_size and d_model must be >= 1, got {config.vocab_size}, {config.d_model}")
        self.layer_kinds = config.layer_kinds()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(
            Block(build_mixer(kind, config.d_model, config.n_heads, config.mixer_options(kind)), config.d_model, config.mlp_ratio)
            for kind in self.layer_kinds
        )
        self.norm = nn.RMSNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    @property
    def mixers(self) -> List[Mixer]:
        return [block.mixer for block in self.blocks]

    def forward(
        self, tokens: Optional[torch.Tensor] = None, states: Optional[Sequence[Optional[MixerState]]] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, States]:
        """tokens [B, T] (or inputs_embeds [B, T, d_model]) -> logits [B, T, V], states."""
        if (tokens is None) == (inputs_embeds is None):
            raise ValueError("DecoderLM: pass exactly one of tokens [B, T] or inputs_embeds [B, T, d_model]")
        if tokens is not None:
            if tokens.dim() != 2:
                raise ValueError(f"DecoderLM: tokens must be [B, T] (rank 2), got shape {tuple(tokens.shape)}")
            if tokens.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"DecoderLM: tokens must be integers, got {tokens.dtype}")
            x = self.embed(tokens)
        else:
            x = inputs_embeds
        x, states = self.forward_hidden(x, states)
        return self.head(self.norm(x)), states

    def forward_hidden(
        self, x: torch.Tensor, states: Optional[Sequence[Optional[MixerState]]] = None
    ) -> Tuple[torch.Tensor, States]:
        """The blocks alone: x [B, T, d_model] -> hidden [B, T, d_model] (before the final norm)."""
        if states is None:
            states = [None] * len(self.blocks)
        if len(states) != len(self.blocks):
            raise ValueError(f"DecoderLM: got {len(states)} states for {len(self.blocks)} blocks")
        new_states: States = []
        for block, state in zip(self.blocks, states):
            x, state = block(x, state)
            new_states.append(state)
        return x, new_states

    def state_nbytes(self, seq_len: int, batch_size: int = 1) -> List[int]:
        """Bytes of each block's state after seq_len tokens (states are kept in >= float32)."""
        dtype = torch.promote_types(self.embed.weight.dtype, torch.float32)
        return [m.state_nbytes(seq_len, batch_size, dtype) for m in self.mixers]


def _merge(base, overrides):
    from omegaconf import OmegaConf

    return OmegaConf.merge(OmegaConf.structured(base) if not isinstance(base, dict) else OmegaConf.create(base),
                           OmegaConf.create(overrides))
