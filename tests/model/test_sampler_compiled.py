"""The compiled decode step (torch.compile with inductor, the default on a GPU) computes what the
eager step computes, and compiles once per step shape: checked on the CPU, where inductor writes
C++ kernels from the same graphs it gives Triton on a GPU."""

import pytest
import torch
from conftest import perturbed_float64_model
from torch._dynamo.utils import counters

from aogpt.model.config import ModelConfig
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, filter_logits

B, N = 3, 16

# fp32's unit roundoff is u = 2^-24 ~ 6e-8. Both steps run the same library matmuls and
# attention; inductor changes only the order of the other reductions it fuses (RMSNorm's mean
# over d = 32, the softmax over 50K logits, the sampler's sums), each off by at most
# length x u relative: ~2e-6 for d = 32, ~3e-3 for 50K terms but only on the softmax, which
# does not feed the logits. Two layers of norms and residual adds keep the logits within
# ~1e-5 of their scale; the bound below is 10x that. A missed term (a wrong mask, a stale
# table, a row read from the wrong slot) moves them by O(1).
LOGIT_BOUND = 1e-4


def peaked_model():
    """fp32, with its head scaled so that its next-token distributions are peaked (as a trained
    model's are: an untrained one spreads ~2e-5 over each of 50K tokens, so that every draw is
    within any rounding of a tie)."""
    config = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=N, cond_dim=8)
    model = perturbed_float64_model(config, seed=1).float()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    return model


def sampler_mid_generation(model, compiled: bool, known: int, targets: int) -> KVCacheSampler:
    """Both samplers in the same state: `known` tokens revealed, `targets` drawn next."""
    sampler = KVCacheSampler(model, B, N, SamplingConfig(steps=N, seed=0), compile=compiled)
    generator = torch.Generator().manual_seed(known)
    sampler.orders.copy_(torch.stack([torch.randperm(N, generator=generator) for _ in range(B)]))
    sampler.ordered[:, :N].copy_(torch.randint(0, 50257, (B, N), generator=generator))
    sampler.uniforms.copy_(torch.rand(B, N, generator=generator, dtype=torch.float64))
    sampler.strategy.bounds.copy_(torch.tensor([[known], [known], [known + targets]]).expand(3, B))
    return sampler


def decision_margin(logits: torch.Tensor, drawn: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """How far (in probability) the inverse-CDF point u x total lies from the nearest edge of the
    drawn token's interval: a perturbation of the logits by e moves every edge by at most
    ~2e (relative), so a margin above that decides the same token."""
    probs = filter_logits(logits, SamplingConfig()).double().softmax(dim=-1)
    cdf = probs.cumsum(dim=-1)
    upper = cdf.gather(-1, drawn[..., None]).squeeze(-1)
    lower = upper - probs.gather(-1, drawn[..., None]).squeeze(-1)
    return torch.minimum(u - lower, upper - u)


@pytest.mark.slow  # inductor compiles C++ for each step shape: ~10-30 s on 2 cores
@pytest.mark.parametrize("known, targets", [(0, 4), (5, 1), (9, 3)],
                         ids=["first-step", "one-target", "parallel-targets"])
def test_a_compiled_step_gives_the_eager_logits_and_tokens_away_from_ties(known, targets):
    model = peaked_model()
    steps = {compiled: sampler_mid_generation(model, compiled, known, targets)
             for compiled in (False, True)}
    bucket = 1 << (targets - 1).bit_length()
    shape = (bucket, bucket, N)  # rows fed: the targets' (slots known..); keys: all N
    outputs = {}
    with torch.no_grad():
        for compiled, sampler in steps.items():
            logits, slots, valid = sampler.call(*shape)
            drawn = sampler.ordered.gather(1, slots.clamp(max=N - 1))
            outputs[compiled] = (logits.clone(), drawn, valid.clone())
    (eager, eager_drawn, valid), (compiled, compiled_drawn, _) = outputs[False], outputs[True]
    scale = eager.abs().max()
    assert (compiled - eager).abs().max() <= LOGIT_BOUND * scale
    positions = steps[False].orders.gather(1, (known + torch.arange(shape[1])).clamp(max=N - 1)[None]
                                           .expand(B, -1))
    u = steps[False].uniforms.gather(1, positions)
    clear = valid & (decision_margin(eager, eager_drawn, u) > 2 * LOGIT_BOUND * scale)
    assert clear.sum() >= valid.sum() // 2  # the comparison below is not empty
    assert torch.equal(compiled_drawn[clear], eager_drawn[clear])
    # the cache rows the step wrote are the eager step's too
    for layer in range(2):
        for ours, theirs in ((steps[True].cache.keys, steps[False].cache.keys),
                             (steps[True].cache.values, steps[False].cache.values)):
            assert (ours[layer] - theirs[layer]).abs().max() <= LOGIT_BOUND * theirs[layer].abs().max()


@pytest.mark.slow
def test_compiled_generation_compiles_each_step_shape_once_and_matches_eager():
    """Whole generations: the same tokens (top-k 3 at a low temperature keeps every draw far
    from a tie), and a second generation compiles nothing more."""
    model = peaked_model()
    config = SamplingConfig(steps=5, top_k=3, temperature=0.5, seed=4)
    eager = KVCacheSampler(model, B, N, config, compile=False).generate(torch.arange(B))
    compiled = KVCacheSampler(model, B, N, config, compile=True)
    counters.clear()
    first = compiled.generate(torch.arange(B))
    graphs = counters["stats"]["unique_graphs"]
    second = compiled.generate(torch.arange(B, 2 * B))
    assert graphs > 0 and counters["stats"]["unique_graphs"] == graphs  # no recompilation
    assert torch.equal(first.tokens, eager.tokens) and torch.equal(first.orders, eager.orders)
    assert not torch.equal(second.tokens, first.tokens)  # other samples: other tokens


def test_the_tables_follow_the_weights_when_they_change_in_place():
    """AdaLN tables are built once per sampler; an optimizer step or load_state_dict changes the
    weights in place, and the next generation uses the new ones."""
    model = peaked_model()
    config = SamplingConfig(steps=4, temperature=0.0)
    sampler = KVCacheSampler(model, B, N, config, compile=False)
    sampler.generate(torch.arange(B))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "adaLN" in name or "wtpe" in name:
                p.mul_(-3.0)
    fresh = KVCacheSampler(model, B, N, config, compile=False).generate(torch.arange(B))
    assert torch.equal(sampler.generate(torch.arange(B)).tokens, fresh.tokens)
