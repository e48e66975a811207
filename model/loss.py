"""Per-token cross-entropy of the output head without the full logits tensor.

A batch of 16 x 1024 tokens over the 50304-word vocabulary has 824M logits: 3.3 GB in fp32, and
the straightforward loss keeps several tensors of that size alive until backward (the logits,
their fp32 copy, the log-softmax, then its gradient). Here the head's matmul and the
cross-entropy are one autograd function that goes through the tokens in chunks, so only one
chunk's logits ever exist. It computes the gradients during the forward pass, while each chunk's
softmax is at hand (as Liger-Kernel's fused linear cross-entropy does):

    d nll_i / d logits_i = softmax_i - onehot(target_i) =: E_i
    grad_h_i = g_i (E_i W)            kept unscaled, (n, d): exact for any incoming gradient g
    grad_W   = sum_i g_i E_i^T h_i    kept for uniform g

The function returns the per-token NLL and their mean. Training backpropagates the mean: its
gradient g = grad / n is the same for every token by construction, so the backward pass only
scales what the forward pass summed, with no device sync. A weighted mean, mean(w_i nll_i)
(order.weighting), is summed the same way with each E_i scaled by w_i in the forward pass;
weights of ones give the unweighted numbers bit for bit. If a caller backpropagates the
per-token NLL instead, the backward pass checks whether that gradient is uniform (one device
sync) and otherwise makes the chunks' logits again for the gradients.

The softmax of a chunk (upcast, logsumexp, exp, minus the one-hot) is a few passes over
(chunk x vocab) numbers that cost more memory traffic than the head's matmul itself. On a GPU
`compile_chunk_math` compiles `fused_chunk_math`, written for inductor: one reduction reads the
logits for their logsumexp, one pointwise pass reads them again and writes the gradient in the
logits' dtype (the fp32 softmax lives in registers only; an in-place subtraction at the targets
would make inductor write and re-read an fp32 chunk x vocab tensor). Eager on a CPU,
`chunk_math` makes the gradient in place, and the chunks are small enough for their logits to
stay in the last-level cache. Both compute the same numbers.

Under bf16 autocast the head's fp32 weights are cast for the matmuls; the cast is made once per
optimizer step when the caller passes it (LMHead), and the weight gradient is accumulated in
fp32 by the matmul itself where the device has such a kernel (CUDA), without a bf16 product.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import torch
import torch.nn.functional as F


def compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype autocast would run the head's matmul in (the activations' without it)."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype


def _in_compute_dtype(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      cast_weight: torch.Tensor | None = None):
    """The operands in compute_dtype; cast_weight: the weight already cast (LMHead's)."""
    dtype = compute_dtype(hidden)
    if cast_weight is None or cast_weight.dtype != dtype:
        cast_weight = weight.to(dtype)
    return hidden.to(dtype), cast_weight, None if bias is None else bias.to(dtype)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 to fp32 for the softmax; fp32 and fp64 stay as they are."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def chunk_math(logits: torch.Tensor, targets: torch.Tensor, token_weights: torch.Tensor | None,
               want_grad: bool, want_bias_grad: bool):
    """One chunk's softmax work: logits (n, vocab) -> nll (n,) in >= fp32, and, if wanted,
    token_weights * (softmax - onehot) in the logits' dtype and its column sum (the bias
    gradient)."""
    logits32 = _upcast(logits)
    lse = logits32.logsumexp(dim=-1)
    nll = lse - logits32.gather(1, targets[:, None]).squeeze(1)
    if not want_grad:
        return nll, None, None
    # One new (n, vocab) tensor, then in place: each pass over it is memory traffic that costs
    # more than the head's matmul on a CPU (a one-hot mask and torch.where were three more).
    grad_logits = (logits32 - lse[:, None]).exp_()
    grad_logits[torch.arange(len(targets), device=logits.device), targets] -= 1.0
    if token_weights is not None:
        grad_logits.mul_(token_weights[:, None])
    grad_b = grad_logits.sum(dim=0) if want_bias_grad else None
    return nll, grad_logits.to(logits.dtype), grad_b


def fused_chunk_math(logits: torch.Tensor, targets: torch.Tensor,
                     token_weights: torch.Tensor | None, want_grad: bool, want_bias_grad: bool):
    """chunk_math's numbers, written for inductor: the gradient in one pointwise expression of
    the logits (softmax minus a one-hot made by comparing an iota with the targets), which it
    fuses into one kernel that reads the logits and writes the gradient in their dtype, after
    one reduction for the logsumexp (with the nll's gather). The bias gradient sums the written
    gradient (the bf16 values the weight gradient's matmul reads too): summing the fp32 values
    instead would make inductor write them all out for the column sums."""
    logits32 = _upcast(logits)
    lse = logits32.logsumexp(dim=-1)
    nll = lse - logits32.gather(1, targets[:, None]).squeeze(1)
    if not want_grad:
        return nll, None, None
    vocab = torch.arange(logits.size(-1), device=logits.device)
    grad_logits = (logits32 - lse[:, None]).exp() - (vocab == targets[:, None]).to(logits32.dtype)
    if token_weights is not None:
        grad_logits = grad_logits * token_weights[:, None]
    grad_logits = grad_logits.to(logits.dtype)
    grad_b = _upcast(grad_logits).sum(dim=0) if want_bias_grad else None
    return nll, grad_logits, grad_b


_chunk_math = chunk_math  # what _chunked_pass calls: eager, or fused_chunk_math compiled


def compile_chunk_math(enabled: bool = True) -> None:
    """Fuses each chunk's softmax work with torch.compile (process-wide; False restores eager).

    Chunks all have the loss_chunk_size shape except possibly the last, so this compiles at most
    twice per dtype and vocabulary; shapes are kept static for the best kernels.
    """
    global _chunk_math
    _chunk_math = torch.compile(fused_chunk_math, dynamic=False) if enabled else chunk_math


@functools.cache
def _matmul_accumulates_in_fp32(device: torch.device) -> bool:
    """Whether this device has a bf16 x bf16 -> fp32 matmul that adds into an fp32 tensor
    (torch.addmm's out_dtype: CUDA, not CPU), found by trying it once on a tiny one."""
    a = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
    out = torch.zeros(2, 2, device=device)
    try:
        torch.addmm(out, a, a, out_dtype=torch.float32, out=out)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def _add_bf16_product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out (fp32) += a @ b (bf16): fp32 sums straight into out where the device has such a
    matmul, else a bf16 product summed over chunks in fp32."""
    if _matmul_accumulates_in_fp32(out.device):
        torch.addmm(out, a, b, out_dtype=out.dtype, out=out)
    else:
        out += _upcast(a @ b)


def _add_weight_grad(grad_w: torch.Tensor, grad_logits: torch.Tensor, h: torch.Tensor) -> None:
    """grad_w (vocab, d) += grad_logits.T @ h, summed in grad_w's dtype (>= fp32)."""
    if grad_w.dtype == grad_logits.dtype:
        grad_w.addmm_(grad_logits.t(), h)  # fp32: accumulate without a temporary
    elif torch.compiler.is_compiling():
        # Inductor has no lowering of addmm's out_dtype ("tuned_addmm() takes 3 positional
        # arguments"), and under tracing the probe above would see fake tensors, which take it
        # on any device: where the loss is traced (the whole model compiled,
        # speed.engine_compile) the product runs eager between graphs, summed as eager code sums
        # it. (torch.compiler.disable imports dynamo: made here, where dynamo is running.)
        torch.compiler.disable(_add_bf16_product)(grad_w, grad_logits.t(), h)
    else:
        _add_bf16_product(grad_w, grad_logits.t(), h)


def _last_level_cache_bytes() -> int:
    """The CPU's largest cache (Linux sysfs), or 16 MiB where it cannot be read."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        with contextlib.suppress(ValueError):
            sizes.append(int(text[:-1]) * 1024 if text.endswith("K") else int(text))
    return max(sizes, default=16 * 2**20)


@functools.cache
def cache_fitted_chunk(vocab: int) -> int:
    """Tokens per chunk on a CPU: as many as keep one chunk's fp32 logits within half the last-level
    cache (at least 16), so the softmax's passes over them hit the cache instead of memory. With a
    50K vocabulary and a 32 MiB cache that is 83 tokens, and the head's forward+backward ran 1.5x
    faster than with 1,024 (benchmarks/cpu_loss.py)."""
    return max(16, _last_level_cache_bytes() // 2 // (4 * vocab))


def _chunked_pass(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, targets: torch.Tensor,
                  chunk_size: int, want: tuple[bool, bool, bool],
                  token_weights: torch.Tensor | None = None):
    """nll (n,) and, as `want` says, the gradients of sum_i token_weights_i * nll_i with respect
    to h, w, b (token_weights None: all ones). h (n, d) and w, b in one compute dtype; the nll
    and the weight and bias gradients in >= fp32."""
    want_h, want_w, want_b = want
    acc = torch.promote_types(h.dtype, torch.float32)  # softmax and sums over chunks
    nll = torch.empty(len(h), dtype=acc, device=h.device)
    grad_h = torch.empty_like(h) if want_h else None
    grad_w = torch.zeros(w.shape, dtype=acc, device=w.device) if want_w else None
    grad_b = torch.zeros(w.shape[0], dtype=acc, device=w.device) if want_b else None
    with torch.autocast(h.device.type, enabled=False):
        for start in range(0, len(h), chunk_size):
            chunk = slice(start, start + chunk_size)
            weights = None if token_weights is None else token_weights[chunk]
            nll[chunk], grad_logits, grad_b_chunk = _chunk_math(
                F.linear(h[chunk], w, b), targets[chunk], weights, any(want), want_b)
            if want_b:
                grad_b += grad_b_chunk
            if want_h:
                torch.mm(grad_logits, w, out=grad_h[chunk])
            if want_w:
                _add_weight_grad(grad_w, grad_logits, h[chunk])
    return nll, grad_h, grad_w, grad_b


def _weighted_mean(nll: torch.Tensor, token_weights: torch.Tensor | None) -> torch.Tensor:
    return nll.mean() if token_weights is None else (nll * token_weights).mean()


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_size, cast_weight, token_weights):
        h, w, b = _in_compute_dtype(hidden, weight, bias, cast_weight)  # hidden (n, d)
        want = tuple(ctx.needs_input_grad[:3])
        nll, grad_h, grad_w, grad_b = _chunked_pass(h, w, b, targets, chunk_size, want,
                                                    token_weights)
        ctx.save_for_backward(hidden, weight, bias, targets, grad_h, grad_w, grad_b,
                              token_weights)
        ctx.chunk_size, ctx.want, ctx.dtype = chunk_size, want, h.dtype
        ctx.set_materialize_grads(False)  # an output nobody differentiates gets None, not zeros
        return nll, _weighted_mean(nll, token_weights)

    @staticmethod
    def backward(ctx, grad_nll, grad_mean):
        hidden, weight, bias, targets, grad_h, grad_w, grad_b, token_weights = ctx.saved_tensors
        n = len(hidden)
        # d mean / d nll_i = w_i/n: what forward summed, scaled; known without the device
        g = None if grad_mean is None else _upcast(grad_mean) / n  # a 0-dim tensor
        if grad_nll is not None and token_weights is not None:
            # per-token gradients on top of a weighted mean's: make every gradient again
            g = _upcast(grad_nll) + (0.0 if g is None else g * token_weights)
            h, w, b = (None if t is None else t.to(ctx.dtype) for t in (hidden, weight, bias))
            _, grad_h, grad_w, grad_b = _chunked_pass(h, w, b, targets, ctx.chunk_size,
                                                      ctx.want, g)
            return (None if grad_h is None else grad_h.to(hidden.dtype),
                    None if grad_w is None else grad_w.to(weight.dtype),
                    None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None)
        if grad_nll is not None:
            per_token = _upcast(grad_nll)
            g = per_token if g is None else per_token + g
        uniform = g.dim() == 0 or bool((g == g[0]).all())  # the second test syncs the device
        if grad_h is not None:
            grad_h = (_upcast(grad_h) * (g if g.dim() == 0 else g[:, None])).to(hidden.dtype)
        if grad_w is not None or grad_b is not None:
            if uniform:  # scale what forward summed
                scale = g if g.dim() == 0 else g[0]
                grad_w = None if grad_w is None else grad_w * scale
                grad_b = None if grad_b is None else grad_b * scale
            else:
                h, w, b = (None if t is None else t.to(ctx.dtype) for t in (hidden, weight, bias))
                want = (False, *ctx.want[1:])
                _, _, grad_w, grad_b = _chunked_pass(h, w, b, targets, ctx.chunk_size, want, g)
        return (grad_h,
                None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor, chunk_size: int,
                         return_mean: bool = False, cast_weight: torch.Tensor | None = None,
                         token_weights: torch.Tensor | None = None):
    """-log softmax(hidden @ weight.T + bias)[targets] per token, shaped like targets: fp32
    (fp64 for a float64 model). With return_mean, (nll, nll.mean()): backpropagate the mean,
    the training loss, and the backward pass needs no device sync.

    hidden is (*targets.shape, d). chunk_size tokens at a time (on a CPU at most
    cache_fitted_chunk's); 0 makes all logits at once (the straightforward path, kept as the
    baseline). cast_weight: weight already in compute_dtype (detached), used if that dtype is
    the one needed; gradients still go to `weight`. token_weights (shaped like targets): the
    mean is (nll * token_weights).mean() instead, the nll unweighted; None: no product at all.
    """
    flat_hidden = hidden.reshape(-1, hidden.size(-1))  # (b*t, d)
    flat_targets = targets.reshape(-1)
    flat_weights = None if token_weights is None else token_weights.reshape(-1).to(
        torch.promote_types(hidden.dtype, torch.float32))
    if hidden.device.type == "cpu" and chunk_size:
        chunk_size = min(chunk_size, cache_fitted_chunk(weight.shape[0]))
    if chunk_size == 0:
        logits = _upcast(F.linear(flat_hidden, weight, bias))
        nll = F.cross_entropy(logits, flat_targets, reduction="none")
        mean = _weighted_mean(nll, flat_weights)
    elif torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                         for t in (hidden, weight, bias)):
        nll, mean = _ChunkedLinearCrossEntropy.apply(flat_hidden, weight, bias, flat_targets,
                                                     chunk_size, cast_weight, flat_weights)
    else:
        nll = _chunked_pass(*_in_compute_dtype(flat_hidden, weight, bias, cast_weight),
                            flat_targets, chunk_size, want=(False, False, False))[0]
        mean = _weighted_mean(nll, flat_weights)
    nll = nll.view_as(targets)
    return (nll, mean) if return_mean else nll
