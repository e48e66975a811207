"""Stand-in of the paper's training model: AOGPTConfig, AOGPT(config) with forward(idx, mode,
random_ratio) -> (logits, mean loss) and configure_optimizers(...) -> an AdamW."""

from dataclasses import dataclass

import torch

from aogpt.model import AOGPT as OurModel
from aogpt.model import ModelConfig, OrderConfig, OrderSampler


@dataclass
class AOGPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class AOGPT(OurModel):
    def __init__(self, config: AOGPTConfig):
        super().__init__(ModelConfig(n_layer=config.n_layer, n_head=config.n_head,
                                     n_embd=config.n_embd, block_size=config.block_size,
                                     vocab_size=config.vocab_size, bias=config.bias, cond_dim=128,
                                     loss_chunk_size=0))
        self.calls = 0

    def forward(self, idx, mode="Random", orders=None, random_ratio=None):
        assert mode == "Random_CL" and random_ratio is not None
        sampler = OrderSampler(OrderConfig(kind="mixture", p_left_to_right=1 - random_ratio),
                               idx.shape[1], seed=0)
        self.calls += 1
        orders, _ = sampler(self.calls, torch.arange(len(idx), device=idx.device))
        return None, super().forward(idx, orders).mean()

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return torch.optim.AdamW(self.param_groups(weight_decay), lr=learning_rate, betas=betas)
