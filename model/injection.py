"""How the position of the token each slot predicts reaches the network: one class per decoder
variant, named by model.target_injection (VARIANTS).

    "adaln"      AO-GPT: a cond_dim-wide code per target position (wtpe), projected per block to
                 per-token AdaLN modulations (shift, scale, gate for attention and MLP) and to a
                 shift and scale in the final layer
    "sigma_sum"  sigma-GPT: an n_embd-wide embedding of the target position added to the input
    "none"       a plain GPT: told nothing, so it reads left to right only

The parameters live in the network's own modules (transformer.wtpe, each block's adaLN, the final
layer's adaLN_final: the paper's names, so its checkpoints load by name); a variant says which of
them exist and what they do. A new variant is a subclass here and an entry in VARIANTS: the
config, the network, warm starts, checkpoints and every command follow (docs/extending.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from aogpt.model.config import ModelConfig


class TargetInjection:
    """A variant with no target information (the interface, and the plain GPT's behaviour)."""

    family = "left-to-right GPT"  # the model's name in reports and logs
    any_order = False  # whether it is told each target's position, so can read any order

    def target_table(self, config: ModelConfig) -> nn.Embedding | None:
        """transformer.wtpe: one row per target position, or None."""
        return None

    def modulation(self, config: ModelConfig, ways: int) -> nn.Module | None:
        """A block's (ways=6) or the final layer's (ways=2) projection of the target code to
        per-token modulations, or None (the block is a plain pre-norm block)."""
        return None

    def embed(self, x: torch.Tensor, wtpe: nn.Embedding | None,
              target_positions: torch.Tensor) -> torch.Tensor:
        """The residual stream's input x (b, s, d) with the target positions (b, s) added, for a
        variant that adds them there."""
        return x

    def tables(self, transformer: nn.ModuleDict, target_positions: torch.Tensor | None
               ) -> tuple[list[torch.Tensor | None], torch.Tensor | None]:
        """The modulation tables of every block and the final layer, and each slot's row in them
        (see AOGPT.adaln_tables); all None without modulations."""
        return [None] * (len(transformer.h) + 1), target_positions

    @torch.no_grad()
    def start_as_identity(self, transformer: nn.ModuleDict) -> None:
        """Sets what the variant adds so that the network computes what a plain GPT with the same
        other weights computes (a warm start from one, model/warm_start.py)."""


class AdaLN(TargetInjection):
    family = "AO-GPT"
    any_order = True

    def target_table(self, config: ModelConfig) -> nn.Embedding:
        return nn.Embedding(config.block_size, config.cond_dim)

    def modulation(self, config: ModelConfig, ways: int) -> nn.Module:
        return nn.Sequential(nn.SiLU(), nn.Linear(config.cond_dim, ways * config.n_embd))

    def tables(self, transformer: nn.ModuleDict, target_positions: torch.Tensor | None
               ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        codes, rows = transformer.wtpe.weight, target_positions  # (block_size, cond_dim)
        if target_positions is not None and target_positions.numel() < len(codes):
            codes = transformer.wtpe(target_positions).flatten(0, -2)  # (b * s, cond_dim)
            rows = torch.arange(len(codes), device=codes.device).view_as(target_positions)
        # module calls, so that ZeRO-3 gathers each projection's weights
        return ([block.adaLN(codes) for block in transformer.h]
                + [transformer.final_layer.adaLN_final(codes)], rows)

    @torch.no_grad()
    def start_as_identity(self, transformer: nn.ModuleDict) -> None:
        """Zero shifts and scales, gates of one: each block and the final layer as a plain GPT's."""
        n_embd = transformer.wte.embedding_dim
        for block in transformer.h:  # chunks: shift, scale, gate (attention), then the MLP's
            linear = block.adaLN[1]
            linear.weight.zero_()
            gates = linear.bias.view(6, n_embd)
            gates.zero_()
            gates[2].fill_(1.0)
            gates[5].fill_(1.0)
        final = transformer.final_layer.adaLN_final[1]
        final.weight.zero_()
        final.bias.zero_()


class SigmaSum(TargetInjection):
    family = "sigma-GPT"
    any_order = True

    def target_table(self, config: ModelConfig) -> nn.Embedding:
        return nn.Embedding(config.block_size, config.n_embd)  # added to the input

    def embed(self, x: torch.Tensor, wtpe: nn.Embedding, target_positions: torch.Tensor
              ) -> torch.Tensor:
        return x + wtpe(target_positions)

    @torch.no_grad()
    def start_as_identity(self, transformer: nn.ModuleDict) -> None:
        transformer.wtpe.weight.zero_()  # nothing added until training moves it


VARIANTS: dict[str, TargetInjection] = {"adaln": AdaLN(), "sigma_sum": SigmaSum(),
                                        "none": TargetInjection()}
