"""model/hf/modeling_aogpt.py in this process (tests/tools/test_export_hf.py runs an exported
folder): its left-to-right slots are AOGPT.slots's, so padding on either side changes no logit of
a real token, and generate_any_order reads `given` as the sampler's given_tokens does, refusing
bad input as the ValueError that transformers' users expect."""

import dataclasses
import re

import pytest
import torch
from conftest import perturbed_float64_model
from vocabulary_testing import DECODER_VARIANTS, variant_config

from aogpt.model.config import GPT2_VOCAB, ModelConfig
from aogpt.model.sampler import KVCacheSampler, SamplingConfig

BASE = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, cond_dim=8)
KINDS = {variant: variant_config(BASE, variant) for variant in DECODER_VARIANTS}


def wrapped(config: ModelConfig):
    """The project's float64 model and the transformers model holding the same weights."""
    project = perturbed_float64_model(config)
    from aogpt.model.hf.configuration_aogpt import AOGPTConfig  # imports transformers: not
    from aogpt.model.hf.modeling_aogpt import AOGPTForCausalLM  # at collection, on every worker

    hf = AOGPTForCausalLM(AOGPTConfig(**dataclasses.asdict(config))).double().eval()
    hf.aogpt.load_state_dict(project.state_dict())
    return project, hf


@pytest.mark.parametrize("kind", list(KINDS))
def test_logits_are_the_projects(kind):
    """logits[:, k] predicts token k + 1: the project's slot k + 1 ([None] is slot 0); the last
    one, past the tokens given, is checked against a longer input."""
    project, hf = wrapped(KINDS[kind])
    ids = torch.randint(0, GPT2_VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids[:, :-1]).logits, project.logits(ids)[:, 1:], rtol=0,
                                   atol=1e-12)


@pytest.mark.parametrize("kind", list(KINDS))
def test_padding_on_either_side_changes_no_logit_of_a_real_token(kind):
    """Rows behind left padding, before right padding, and both: each real token's logits are
    those of the real tokens alone (float64: the masked attention kernel sums in another
    order, which moves nothing at this tolerance)."""
    _, hf = wrapped(KINDS[kind])
    ids = torch.randint(0, GPT2_VOCAB, (4, 12), generator=torch.Generator().manual_seed(1))
    real = torch.ones_like(ids, dtype=torch.bool)
    real[1, :5] = False  # left padding
    real[2, 8:] = False  # right padding
    real[3, :2] = real[3, 9:] = False
    with torch.no_grad():
        padded = hf(ids, attention_mask=real.long()).logits
        for row in range(len(ids)):
            alone = hf(ids[row, real[row]][None]).logits[0]
            torch.testing.assert_close(padded[row, real[row]], alone, rtol=0, atol=1e-12)
        # no padding: the causal kernel, in a batch of 4 or alone (a CPU's float64 matmul may
        # block a batch of 4 and one of 1 differently: equal to the same rounding, not bitwise)
        torch.testing.assert_close(padded[0], hf(ids[:1]).logits[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("given, message", [
    ({10: [1, 2, 3, 4, 5, 6, 7]}, "given text at 10..16 does not fit in a sequence of 16 tokens"),
    ({0: [1, 2], 1: [3]}, "given text at 1..1 overlaps other given text"),
    ({0: [GPT2_VOCAB]}, f"given tokens at 0: token ids must be in 0..{GPT2_VOCAB - 1}"),
    ({"x": [1]}, "infill key 'x' is not a token position"),
    ({0: "text"}, "given text at 0 needs a tokenizer: pass encoding, or give token ids"),
])
def test_bad_given_tokens_are_a_value_error(given, message):
    _, hf = wrapped(BASE)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        hf.generate_any_order(given=given)


def test_given_tokens_may_be_a_tensor():
    """A tokenizer's return_tensors="pt" ids, (1, n), read as their n ids."""
    _, hf = wrapped(BASE)
    as_list = hf.generate_any_order(num_samples=2, given={0: [464, 1748], 9: [13]}, steps=4)
    as_tensor = hf.generate_any_order(num_samples=2, given={0: torch.tensor([[464, 1748]]),
                                                            9: torch.tensor([13])}, steps=4)
    assert torch.equal(as_list.tokens, as_tensor.tokens)
    assert (as_list.tokens[:, :2] == torch.tensor([464, 1748])).all()


def test_generate_any_order_takes_the_speculative_samplers_draft_tree():
    """sampler="speculative", draft, tree and predraft pass through to the sampler: the tokens
    are the KV-cache sampler's with the same settings."""
    model, hf = wrapped(BASE)
    settings = {"sampler": "speculative", "draft": 3, "tree": 2, "predraft": 2, "seed": 4}
    out = hf.generate_any_order(num_samples=2, **settings)
    n = model.config.block_size
    direct = KVCacheSampler(model.eval(), 2, n, SamplingConfig(steps=n, **settings)).generate(
        torch.arange(2))
    assert torch.equal(out.tokens, direct.tokens)
