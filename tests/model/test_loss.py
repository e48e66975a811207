"""The chunked loss's two formulations (in place for eager CPUs, fused for inductor) compute the
same numbers, the fused one compiles into the kernels it is written for, the head's cast is made
once per optimizer step, and the weight gradient sums in fp32."""

import resource
from pathlib import Path

import pytest
import torch

from aogpt.model import AOGPT, ModelConfig, loss

VOCAB, N = 512, 24


def chunk(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(N, VOCAB, generator=g) * 4).to(dtype)
    targets = torch.randint(0, VOCAB, (N,), generator=g)
    weights = torch.rand(N, generator=g)
    return logits, targets, weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "weighted"])
def test_fused_and_in_place_chunk_math_give_the_same_numbers(dtype, weighted):
    logits, targets, weights = chunk(dtype)
    weights = weights if weighted else None
    in_place = loss.chunk_math(logits, targets, weights, True, True)
    fused = loss.fused_chunk_math(logits, targets, weights, True, True)
    torch.testing.assert_close(fused[0], in_place[0], rtol=0, atol=0)  # the same ops for nll
    # the gradient: exp(x - lse) - onehot, in fp32 either way, then rounded to the logits' dtype:
    # equal in fp32; in bf16 the same fp32 value rounds the same way
    assert torch.equal(fused[1], in_place[1])
    # the bias gradient: fused sums the rounded values, each within bf16's unit roundoff (2^-8)
    bound = 2**-8 * in_place[1].float().abs().sum(dim=0) if dtype == torch.bfloat16 else 1e-6
    assert ((fused[2] - in_place[2]).abs() <= bound + 1e-6).all()


@pytest.mark.slow  # inductor writes C++: ~10-20 s
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_compiled_fused_chunk_math_equals_eager_without_an_fp32_chunk_in_memory(dtype):
    """Inductor reorders the logsumexp's and the column sum's reductions over 512 terms (each off
    by <= 512 u relative, u = 6e-8 in fp32: 3e-5); the gradient is the same pointwise expression,
    rounded to the logits' dtype (a bf16 ulp, 2^-8, where rounding lands the other way). Its
    generated code writes no fp32 (chunk x vocab) buffer for bf16 logits: the softmax and the
    one-hot live in registers, and the gradient is written once, in bf16."""
    from torch._inductor.utils import run_and_get_code

    logits, targets, weights = chunk(dtype)
    torch._dynamo.reset()
    compiled = torch.compile(loss.fused_chunk_math, dynamic=False)
    outputs, (code, *_) = run_and_get_code(compiled, logits, targets, weights, True, True)
    eager = loss.fused_chunk_math(logits, targets, weights, True, True)
    tolerance = 5e-5 if dtype == torch.float32 else 2**-8
    for ours, theirs in zip(outputs, eager, strict=True):
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=tolerance, atol=tolerance)
    allocations = [line for line in code.splitlines() if "empty_strided" in line and "(" in line
                   and f"({N}, {VOCAB})" in line]
    wide = "torch.float32" if dtype == torch.bfloat16 else "never"
    assert [line for line in allocations if wide in line] == []
    assert len(allocations) == 1  # the gradient itself


def test_the_head_is_cast_once_per_optimizer_step_and_again_after_it():
    torch.manual_seed(0)
    model = AOGPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, cond_dim=4))
    idx = torch.randint(0, 50257, (2, 8))
    head = model.lm_head
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(idx)
        assert head._cast_weight is None  # never told: every forward casts
        head.weights_changed()
        model(idx)
        first = head._cast_weight
        model(idx)
        assert first.dtype == torch.bfloat16 and head._cast_weight is first  # reused
        with torch.no_grad():
            head.weight.add_(1.0)
        head.weights_changed()
        _, mean = model(idx, return_mean=True)
        assert head._cast_weight is not first
        torch.testing.assert_close(head._cast_weight, head.weight.detach().to(torch.bfloat16))
    mean.backward()
    assert head.weight.grad.dtype == torch.float32  # gradients go to the fp32 weights
    model(idx)  # fp32 (no autocast): nothing to cast, nothing kept
    assert head._cast_weight.dtype == torch.bfloat16


def test_a_bf16_weight_gradient_is_summed_over_chunks_in_fp32():
    g = torch.Generator().manual_seed(1)
    grad_logits = torch.randn(64, VOCAB, generator=g).to(torch.bfloat16)
    h = torch.randn(64, 16, generator=g).to(torch.bfloat16)
    grad_w = torch.zeros(VOCAB, 16)
    for rows in (slice(0, 32), slice(32, 64)):
        loss._add_weight_grad(grad_w, grad_logits[rows], h[rows])
    exact = grad_logits.double().t() @ h.double()
    # bf16 products rounded once each (2^-8 relative) per chunk, summed in fp32
    assert grad_w.dtype == torch.float32
    torch.testing.assert_close(grad_w.double(), exact, rtol=2**-7, atol=2**-7 * exact.abs().max())


def test_a_large_cpu_tensor_is_faulted_in_huge_pages():
    """Importing aogpt sets torch's THP_MEM_ALLOC_ENABLE (aogpt/__init__.py): a fresh 64 MiB
    tensor is filled with ~550 page faults (2 MB pages) instead of 16,384 (4 KB pages), as each
    chunk's fresh logits in the loss are (benchmarks/cpu_loss.py: 1,762 -> 1,450 ms)."""
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.is_file() or "[never]" in mode.read_text():
        pytest.skip("this kernel has transparent huge pages off")
    pages = (64 << 20) // 4096
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(64 << 20, dtype=torch.uint8)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < pages // 4, f"{faults} page faults for {pages} pages of 4 KB"


def test_the_bf16_weight_gradient_compiles_inside_a_traced_graph_as_it_runs_eager():
    """Compiling the whole model (speed.engine_compile) traces the loss: the head's fp32-summing
    weight gradient must run as it does eager (Inductor has no lowering of addmm's out_dtype,
    and a probe of the device under tracing would see fake tensors, which take it anywhere)."""
    g = torch.Generator().manual_seed(2)
    grad_logits = torch.randn(64, VOCAB, generator=g).to(torch.bfloat16)
    h = torch.randn(64, 16, generator=g).to(torch.bfloat16)

    def summed(grad_w):
        for rows in (slice(0, 32), slice(32, 64)):
            loss._add_weight_grad(grad_w, grad_logits[rows], h[rows])
        return grad_w * 1.0  # an op of the graph's own after the eager call

    torch._dynamo.reset()
    compiled = torch.compile(summed, backend="inductor")(torch.zeros(VOCAB, 16))
    torch.testing.assert_close(compiled, summed(torch.zeros(VOCAB, 16)), rtol=0, atol=0)
