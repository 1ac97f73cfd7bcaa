"""A small decoder-only LM whose blocks take any registered mixer (and hybrids of them).

``logits, states = model(tokens, states=None)``: tokens [B, T] int64 -> logits [B, T, V], and one
``BlockState`` per block (its mixer's state and its token-shift input). Passing ``states`` back continues every lane where it stopped.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ovq_cl.config import ModelConfig, model_config
from ovq_cl.layers import Mixer, build_mixer
from ovq_cl.state import MixerState

States = List[Optional["BlockState"]]


class MLP(nn.Module):
    def __init__(self, d_model: int, ratio: float) -> None:
        super().__init__()
        hidden = max(1, int(round(d_model * ratio)))
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


@dataclasses.dataclass
class BlockState(MixerState):
    """One block's state: its mixer's state, and the last normalised input (the token shift).

    mixer: the mixer's own state (OVQState, KVCacheState, ...).
    shift: [B, 1, d_model], or None when the block has no token shift.
    """

    mixer: MixerState
    shift: Optional[torch.Tensor] = None

    @classmethod
    def from_state_dict(cls, d, mixer_state_type=None):  # type: ignore[override]
        if mixer_state_type is None:
            raise ValueError("BlockState.from_state_dict needs the mixer's state type")
        inner = {k[len("mixer."):]: v for k, v in d.items() if k.startswith("mixer.")}
        unknown = set(d) - {f"mixer.{k}" for k in inner} - {"shift"}
        if unknown:
            raise ValueError(f"BlockState: unknown keys in state dict: {sorted(unknown)}")
        return cls(mixer=mixer_state_type.from_state_dict(inner), shift=d.get("shift"))


class Block(nn.Module):
    """Pre-norm block: x + mixer(shift(norm(x))), then x + mlp(norm(x)).

    The token shift (ours, as in RWKV) feeds the mixer ``h_t + mu * (h_{t-1} - h_t)`` with a
    learnable per-channel ``mu``: the previous token reaches the q/k/v projections, which lets a
    single mixer layer bind a value to the key before it (associative recall is learned in a few
    hundred steps instead of a long plateau). Every mixer gets the same shift, so it stays fair.
    """

    def __init__(self, mixer: Mixer, d_model: int, mlp_ratio: float, token_shift: bool = True) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(d_model)
        self.mixer = mixer
        self.norm2 = nn.RMSNorm(d_model)
        self.mlp = MLP(d_model, mlp_ratio)
        self.shift_mu = nn.Parameter(torch.full((d_model,), 0.5)) if token_shift else None

    def forward(self, x: torch.Tensor, state: Optional[BlockState]) -> Tuple[torch.Tensor, BlockState]:
        if state is not None and not isinstance(state, BlockState):
            raise ValueError(f"Block: state must be BlockState or None, got {type(state).__name__}")
        h = self.norm1(x)
        shift = None
        if self.shift_mu is not None:
            prev = h.new_zeros(h.shape[0], 1, h.shape[2]) if state is None or state.shift is None else state.shift.detach()
            shifted = torch.cat([prev, h[:, :-1]], dim=1)
            shift = h[:, -1:].clone()                          # a view would keep all of h alive
            h = h + self.shift_mu * (shifted - h)
        y, mixer_state = self.mixer(h, None if state is None else state.mixer)
        x = x + y
        return x + self.mlp(self.norm2(x)), BlockState(mixer=mixer_state, shift=shift)


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
            Block(
                build_mixer(kind, config.d_model, config.n_heads, config.mixer_options(kind)),
                config.d_model, config.mlp_ratio, config.token_shift,
            )
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

    def aux_loss(self) -> torch.Tensor:
        """Sum of the mixers' auxiliary losses from the last forward (VQ's commitment loss); 0 if none."""
        total = self.embed.weight.new_zeros(())
        for mixer in self.mixers:
            aux = mixer.aux_loss                       # declared on Mixer (None: no auxiliary loss)
            if aux is not None:
                total = total + aux
        return total

    def state_nbytes(self, seq_len: int, batch_size: int = 1) -> List[int]:
        """Bytes of each block's state after seq_len tokens (states are kept in >= float32)."""
        dtype = torch.promote_types(self.embed.weight.dtype, torch.float32)
        shift = batch_size * self.config.d_model * self.embed.weight.element_size() if self.config.token_shift else 0
        return [m.state_nbytes(seq_len, batch_size, dtype) + shift for m in self.mixers]

    def states_from_state_dicts(self, dicts: Sequence[Dict[str, torch.Tensor]]) -> States:
        """The inverse of ``[s.state_dict() for s in states]``."""
        if len(dicts) != len(self.blocks):
            raise ValueError(f"DecoderLM: got {len(dicts)} state dicts for {len(self.blocks)} blocks")
        return [BlockState.from_state_dict(d, m.state_type) for d, m in zip(dicts, self.mixers)]


class RegressionLM(nn.Module):
    """The same blocks on continuous inputs: ``pred, states = model(x, states)``.

    x: [B, T, d_in] -> input projection -> DecoderLM blocks -> norm -> regression head -> [B, T, d_out].
    Used by the in-context regression stream; the token embedding and LM head of ``lm`` are unused.
    """

    def __init__(self, config: ModelConfig, d_in: int, d_out: int) -> None:
        super().__init__()
        if d_in < 1 or d_out < 1:
            raise ValueError(f"RegressionLM: d_in and d_out must be >= 1, got {d_in}, {d_out}")
        self.lm = DecoderLM(config)
        self.inp = nn.Linear(d_in, config.d_model)
        self.out = nn.Linear(config.d_model, d_out)
        self.d_in, self.d_out = d_in, d_out

    @property
    def mixers(self) -> List[Mixer]:
        return self.lm.mixers

    def forward(self, x: torch.Tensor, states: Optional[Sequence[Optional[MixerState]]] = None):
        if x.dim() != 3 or x.shape[-1] != self.d_in:
            raise ValueError(f"RegressionLM: x must be [B, T, {self.d_in}], got shape {tuple(x.shape)}")
        h, states = self.lm.forward_hidden(self.inp(x), states)
        return self.out(self.lm.norm(h)), states

    def aux_loss(self) -> torch.Tensor:
        return self.lm.aux_loss()

    def state_nbytes(self, seq_len: int, batch_size: int = 1) -> List[int]:
        return self.lm.state_nbytes(seq_len, batch_size)

    def states_from_state_dicts(self, dicts):
        return self.lm.states_from_state_dicts(dicts)


def _merge(base, overrides):
    from omegaconf import OmegaConf

    return OmegaConf.merge(OmegaConf.structured(base) if not isinstance(base, dict) else OmegaConf.create(base),
                           OmegaConf.create(overrides))
