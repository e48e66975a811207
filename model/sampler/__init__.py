"""Any-order generation with a static KV cache.

    engine.py       KVCacheSampler: the order, the cache and the network call every sampler shares
    parallel.py     the paper's sampler: S calls, several positions revealed independently per call
    speculative.py  any-subset speculative decoding: the exact joint of one token per call, in
                    fewer calls
    planners.py     adaptive order: the model picks the next positions by confidence, margin or
                    entropy
    window.py       text longer than the block: a sliding window of given tokens, stop rules
    draw.py         temperature, top-k, top-p and inverse-CDF draws keyed by position
    given.py        a prompt and infill as given tokens
    config.py       SamplingConfig, every setting

SamplingConfig.sampler picks the way tokens are chosen and accepted (engine.STRATEGIES); a new
way is a module here with the interface of parallel.ParallelSampling and an entry in that table.
"""

from aogpt.model.sampler.config import PLANNERS, SAMPLERS, SamplingConfig
from aogpt.model.sampler.draw import filter_logits, inverse_cdf, sample_from_logits, token_probs
from aogpt.model.sampler.engine import STRATEGIES, KVCacheSampler
from aogpt.model.sampler.given import given_tokens
from aogpt.model.sampler.outputs import Generation, LongGeneration, StepOutput, sample_records

__all__ = ["PLANNERS", "SAMPLERS", "STRATEGIES", "Generation", "KVCacheSampler", "LongGeneration",
           "SamplingConfig", "StepOutput", "filter_logits", "given_tokens", "inverse_cdf",
           "sample_from_logits", "sample_records", "token_probs"]
