"""The AO-GPT network, its orders, its sampler and checkpoint loading: no DeepSpeed and nothing of
trainer/, so that the commands, tools and benchmarks load a model without either.

What the trainer, evaluation and sampler call on the network, and where a new order kind or
decoder variant goes: docs/extending.md.
"""

from aogpt.model.checkpoint import load_checkpoint, save_consolidated
from aogpt.model.config import ModelConfig
from aogpt.model.gpt import AOGPT
from aogpt.model.orders import OrderConfig, OrderSampler, shuffle, unshuffle
from aogpt.model.sampler import KVCacheSampler, SamplingConfig

__all__ = ["AOGPT", "KVCacheSampler", "ModelConfig", "OrderConfig", "OrderSampler",
           "SamplingConfig", "load_checkpoint", "save_consolidated", "shuffle", "unshuffle"]
