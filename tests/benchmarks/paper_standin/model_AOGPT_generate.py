"""Stand-in of the paper's generator: AOGPTConfig, AOGPT(config) with the paper's parameter
names and generate(num_samples, sampling_steps, device, schedules, topp, temperature) ->
(num_samples, 1024) tokens."""

from dataclasses import dataclass

import torch

from aogpt.model import AOGPT as OurModel
from aogpt.model import ModelConfig
from aogpt.model.sampler import KVCacheSampler, SamplingConfig


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
                                     vocab_size=config.vocab_size, bias=config.bias, cond_dim=128))

    @torch.no_grad()
    def generate(self, num_samples, sampling_steps, device, schedules="linear", topp=0.9,
                 temperature=0.9, sampling_orders=None):
        config = SamplingConfig(steps=sampling_steps, schedule=schedules, top_p=topp,
                                temperature=temperature, top_p_rule="paper")
        sampler = KVCacheSampler(self, num_samples, 1024, config, cuda_graphs=False, compile=False)
        return sampler.generate(torch.arange(num_samples)).tokens
