"""Stand-in of the paper's generator: AOGPTConfig, AOGPT(config) with the paper's parameter
names and generate(num_samples, sampling_steps, device, schedules, topp, temperature) ->
(num_samples, 1024) tokens."""

import torch
from model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm import AOGPTConfig, our_config

from aogpt.model import AOGPT as OurModel
from aogpt.model.sampler import KVCacheSampler, SamplingConfig

__all__ = ["AOGPT", "AOGPTConfig"]


class AOGPT(OurModel):
    def __init__(self, config: AOGPTConfig):
        super().__init__(our_config(config))

    @torch.no_grad()
    def generate(self, num_samples, sampling_steps, device, schedules="linear", topp=0.9,
                 temperature=0.9, sampling_orders=None):
        config = SamplingConfig(steps=sampling_steps, schedule=schedules, top_p=topp,
                                temperature=temperature, top_p_rule="paper")
        sampler = KVCacheSampler(self, num_samples, 1024, config, cuda_graphs=False, compile=False)
        return sampler.generate(torch.arange(num_samples)).tokens
