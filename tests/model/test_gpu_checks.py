"""The code paths only a GPU takes, each checked against a reference a CPU computes or a float64
one: what benchmarks/gpu_report.py runs first of all (with the other `pytest -m gpu` tests).

- the order hash and the shuffle (training's OrderSampler, eager and compiled; the sampler's
  orders, counts and token uniforms) draw on a GPU bitwise what they draw on a CPU: integer
  arithmetic and stable sorts, so a compiled kernel that drew other orders would be a silent bug;
- the float64 two-level inverse CDF, under Triton (compiled) and eager, draws the tokens a CPU
  draws from the same probabilities;
- the head's weight gradient accumulates in fp32 inside the matmul (bf16 x bf16 -> fp32 into
  the fp32 gradient): a device without that kernel falls back silently to a bf16 product;
- the sampler compiled and replayed as CUDA graphs (what trainer/sample.py runs on a GPU) draws
  the tokens of eager steps, over whole generations, a second generation and after a weight
  change (a value decided on the host and baked into a graph would replay stale).
"""

import pytest
import torch
from vocabulary_testing import order_configs

from aogpt.model import AOGPT, ModelConfig, OrderSampler
from aogpt.model import loss as loss_module
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, inverse_cdf
from aogpt.model.sampler.draw import position_uniforms
from aogpt.model.sampler.engine import draw_orders
from aogpt.model.sampler.parallel import reveal_counts

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
N = 128

ORDER_CONFIGS = order_configs(16)  # every order kind, and the settings that draw differently


# every kind eager; compiled (a graph each: seconds), the two whose kernels differ most
CASES = [(name, False) for name in ORDER_CONFIGS] + [("mixture", True), ("blockwise-across", True)]


@pytest.mark.parametrize("name, compiled", CASES,
                         ids=[f"{name}-{'compiled' if c else 'eager'}" for name, c in CASES])
def test_training_orders_on_the_gpu_are_bitwise_those_of_the_cpu(name, compiled):
    config = ORDER_CONFIGS[name]
    on_cpu, on_gpu = OrderSampler(config, N, seed=3), OrderSampler(config, N, seed=3)
    if compiled:
        on_gpu.compile()
    for step in (0, 7, 60, 1000):
        ids = torch.arange(16) + 1000 * step  # dataset indices, large ones too
        orders, is_l2r = on_cpu(step, ids)
        gpu_orders, gpu_is_l2r = on_gpu(step, ids.to(CUDA))
        assert torch.equal(gpu_orders.cpu(), orders) and torch.equal(gpu_is_l2r.cpu(), is_l2r)


@pytest.mark.parametrize("counts", ["deterministic", "binomial"])
def test_the_samplers_orders_counts_and_uniforms_on_the_gpu_are_those_of_the_cpu(counts):
    config = SamplingConfig(steps=16, counts=counts, seed=5)
    ids = torch.arange(8) + 10**6
    given = torch.zeros(8, N, dtype=torch.bool)
    given[:, :10] = True
    assert torch.equal(draw_orders(config, given.to(CUDA), ids.to(CUDA)).cpu(),
                       draw_orders(config, given, ids))
    assert torch.equal(reveal_counts(config, given.sum(1).to(CUDA), N, ids.to(CUDA)),
                       reveal_counts(config, given.sum(1), N, ids))
    uniforms = position_uniforms(config, ids, N)
    assert torch.equal(position_uniforms(config, ids.to(CUDA), N).cpu(), uniforms)  # bitwise


def test_the_float64_inverse_cdf_draws_on_the_gpu_what_it_draws_on_a_cpu():
    """The same fp32 probabilities (a nucleus filter's zeros among them) and float64 uniforms,
    the extremes included. Both sum the same numbers in float64, in other orders: a token can
    differ only where u x total falls within ~1e-16 of a boundary, a chance of ~1e-12 here."""
    generator = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(8, 4, 50304, generator=generator)
    logits[:, :, 50257:] = float("-inf")  # the padded ids
    logits[0] = torch.where(logits[0] > 4, logits[0], float("-inf"))  # a filtered row
    probs = logits.softmax(dim=-1)
    uniforms = torch.rand(8, 4, generator=generator, dtype=torch.float64)
    uniforms[1, 0], uniforms[1, 1] = 0.0, 1 - 2.0**-53
    expected = inverse_cdf(probs, uniforms)
    compiled = torch.compile(inverse_cdf, dynamic=False, fullgraph=True)
    for draw in (inverse_cdf, compiled):
        assert torch.equal(draw(probs.to(CUDA), uniforms.to(CUDA)).cpu(), expected)
    assert (probs.gather(-1, expected[..., None]) > 0).all()


def test_the_heads_weight_gradient_is_summed_in_fp32_inside_the_matmul():
    """bf16 x bf16 products summed in fp32 into the fp32 gradient, chunk after chunk: its error
    against a float64 sum is that of fp32 sums (~2^-24 x sqrt(terms) relative, ~1e-6 at most
    here). The silent fallback, a bf16 product per chunk then added in fp32, is off by bf16's
    rounding (2^-9 relative, ~2e-3): 1e-4 tells them apart with a wide margin either way."""
    assert loss_module._matmul_accumulates_in_fp32(CUDA)  # the device has the kernel
    generator = torch.Generator().manual_seed(0)
    chunks = [(torch.randn(256, 1024, generator=generator).bfloat16(),
               torch.randn(256, 64, generator=generator).bfloat16()) for _ in range(8)]
    grad_w = torch.zeros(1024, 64, device=CUDA)
    reference = torch.zeros(1024, 64, dtype=torch.float64)
    for grad_logits, hidden in chunks:
        loss_module._add_weight_grad(grad_w, grad_logits.to(CUDA), hidden.to(CUDA))
        reference += grad_logits.double().t() @ hidden.double()
    error = ((grad_w.cpu().double() - reference).abs().max() / reference.abs().max()).item()
    assert error < 1e-4


def tiny_fp32_model() -> AOGPT:
    torch.manual_seed(0)
    config = ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, cond_dim=16)
    return AOGPT(config).to(CUDA).eval()


@pytest.mark.parametrize("steps", [64, 9], ids=["one-token-steps", "parallel-steps"])
def test_compiled_steps_replayed_as_cuda_graphs_draw_the_tokens_of_eager_steps(steps):
    """fp32 with TF32 off: compiled kernels reorder the same sums, ~1e-6 of a logit, and a token
    can differ only where a uniform falls that close to a boundary of the CDF (~1e-5 over these
    draws). A stale graph (a bound, a table or a weight baked in at capture) draws others."""
    model, precision = tiny_fp32_model(), torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        config = SamplingConfig(steps=steps, seed=1)
        eager = KVCacheSampler(model, 4, 64, config, cuda_graphs=False, compile=False)
        graphed = KVCacheSampler(model, 4, 64, config, cuda_graphs=True, compile=True)
        given = torch.zeros(3, 64, dtype=torch.long)
        given[:, :5] = torch.arange(5) + 100
        mask = given > 0
        for ids, tokens, known in ((torch.arange(4), None, None),
                                   (torch.arange(3) + 50, given, mask)):  # another plan, replayed
            assert torch.equal(graphed.generate(ids, tokens, known).tokens,
                               eager.generate(ids, tokens, known).tokens)
        with torch.no_grad():  # a weight change: the AdaLN tables and the weights are re-read
            for name, param in model.named_parameters():
                param.mul_(1.5 if "adaLN" in name or "wtpe" in name else 0.9)
        ids = torch.arange(4) + 7
        assert torch.equal(graphed.generate(ids).tokens, eager.generate(ids).tokens)
        assert graphed.compiled and graphed.cuda_graphs  # no fall-back to eager on the way
    finally:
        torch.set_float32_matmul_precision(precision)
