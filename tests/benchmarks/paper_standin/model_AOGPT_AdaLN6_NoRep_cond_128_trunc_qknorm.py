"""Stand-in of the paper's training model: AOGPTConfig, AOGPT(config) with forward(idx, mode,
random_ratio) -> (logits, mean loss) and configure_optimizers(...) -> an AdamW."""

from dataclasses import dataclass

import torch

from aogpt.model import AOGPT as OurModel
from aogpt.model import ModelConfig


@dataclass
class AOGPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


def our_config(config: AOGPTConfig, **changes) -> ModelConfig:
    return ModelConfig(n_layer=config.n_layer, n_head=config.n_head, n_embd=config.n_embd,
                       block_size=config.block_size, vocab_size=config.vocab_size,
                       bias=config.bias, cond_dim=128, **changes)


class AOGPT(OurModel):
    def __init__(self, config: AOGPTConfig):
        super().__init__(our_config(config, loss_chunk_size=0))

    def forward(self, idx, mode="Random", orders=None, random_ratio=None):
        """A random order for a random_ratio of the samples, left to right for the others."""
        assert mode == "Random_CL" and random_ratio is not None
        b, t = idx.shape
        shuffled = torch.rand(b, device=idx.device) < random_ratio
        permutations = torch.rand(b, t, device=idx.device).argsort(dim=-1)
        orders = torch.where(shuffled[:, None], permutations, torch.arange(t, device=idx.device))
        return None, super().forward(idx, orders).mean()

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return torch.optim.AdamW(self.param_groups(weight_decay), lr=learning_rate, betas=betas)
