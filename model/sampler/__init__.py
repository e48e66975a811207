"""Any-order generation with a static KV cache.

    engine.py       KVCacheSampler: the order, the cache and the network call every way shares
    strategy.py     the Strategy protocol: what a way of choosing tokens is to the engine, what
                    it may write of the engine's state, the call shapes; the seams of the draft
                    tree and call recording
    ways.py         WAYS, the closed table of the ways of choosing tokens: each one's strategy,
                    flags, checks, call estimate and summary line
    parallel.py     the paper's sampler: S calls, several positions revealed independently per call
    speculative.py  any-subset speculative decoding: the exact joint of one token per call, in
                    fewer calls
    planners.py     adaptive order: the model picks the next positions by confidence, margin,
                    entropy or a threshold
    window.py       text longer than the block: a sliding window of given tokens, stop rules
    draw.py         temperature, top-k, top-p and the one inverse-CDF draw keyed by position
    given.py        a prompt and infill as given tokens
    config.py       SamplingConfig, every setting
    cache.py        the static KV cache
    outputs.py      what a generation returns, and the JSON record of each sample

SamplingConfig.sampler or .planner names the way tokens are chosen (ways.way_of); a new way is a
module here with a Strategy and an entry in ways.py's WAYS (docs/extending.md).
"""

from aogpt.model.sampler.config import SamplingConfig
from aogpt.model.sampler.draw import filter_logits, inverse_cdf, sample_from_logits, token_probs
from aogpt.model.sampler.engine import KVCacheSampler
from aogpt.model.sampler.given import given_tokens
from aogpt.model.sampler.outputs import Generation, LongGeneration, sample_records
from aogpt.model.sampler.strategy import StepOutput
from aogpt.model.sampler.ways import PLANNERS, SAMPLERS, WAYS, way_of

__all__ = ["PLANNERS", "SAMPLERS", "WAYS", "Generation", "KVCacheSampler", "LongGeneration",
           "SamplingConfig", "StepOutput", "filter_logits", "given_tokens", "inverse_cdf",
           "sample_from_logits", "sample_records", "token_probs", "way_of"]
