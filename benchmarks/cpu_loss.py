"""The chunked cross-entropy's forward+backward on a CPU: chunk size and softmax formulation.

    python benchmarks/cpu_loss.py [--tokens 4096] [--width 64] [--repeats 3] [--no-compiled]

On a CPU the head's loss over GPT-2's 50K vocabulary is bound by memory traffic, not by its
matmul: a chunk of 1,024 tokens has 206 MB of fp32 logits, and each pass of the softmax over them
goes to memory. In one process, on the same hidden states and weights, this times the loss of
model/loss.py (in place, chunks fitted to the last-level cache: cache_fitted_chunk) against
(a) the same chunk math at the configs' chunk sizes (1,024 for tiny.yaml, 4,096 the default) and
(b) the earlier chunk math (a one-hot mask and torch.where: three more passes) at those sizes,
and reports each as a ratio. Then, compiled with inductor as on a GPU (--no-compiled skips it):
model/loss.py's fused_chunk_math (one pointwise pass writing the gradient in the logits' dtype)
against the in-place chunk_math compiled (what the GPU ran before: the in-place subtraction made
inductor write and re-read an fp32 chunk x vocab tensor), in fp32 and, where the CPU has native
bf16, in bf16. Best of --repeats runs: other work on the machine only adds time.
"""

import argparse
import sys
import time

import torch

from aogpt import check_counts, cli_entry
from aogpt.model import loss
from aogpt.model.config import PADDED_VOCAB
from aogpt.model.precision import cpu_has_native_bf16, device_name


def earlier_chunk_math(logits, targets, token_weights, want_grad, want_bias_grad):
    """The formulation model/loss.py had before: a one-hot mask via torch.where (the baseline)."""
    logits32 = logits.float()
    lse = logits32.logsumexp(dim=-1)
    nll = lse - logits32.gather(1, targets[:, None]).squeeze(1)
    vocab = torch.arange(logits.size(-1), device=logits.device)
    probs = (logits32 - lse[:, None]).exp()
    grad_logits = torch.where(vocab == targets[:, None], probs - 1.0, probs)
    grad_b = grad_logits.sum(dim=0) if want_bias_grad else None
    return nll, grad_logits.to(logits.dtype), grad_b


def best_seconds(math, chunk: int, args, tensors) -> float:
    loss._chunk_math = math
    try:
        loss._chunked_pass(*tensors, chunk, (True, True, True))  # warm-up (and compilation)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            loss._chunked_pass(*tensors, chunk, (True, True, True))
            times.append(time.perf_counter() - start)
        return min(times)
    finally:
        loss._chunk_math = loss.chunk_math


def compiled_rows(args, tensors) -> None:
    """The GPU's path on inductor's CPU backend: fused against in place, same chunk."""
    dtypes = [torch.float32] + ([torch.bfloat16] if cpu_has_native_bf16() else [])
    print(f"  compiled (inductor), chunk {args.compiled_chunk}:")
    for dtype in dtypes:
        cast = [t.to(dtype) if t.is_floating_point() else t for t in tensors]
        fused = best_seconds(torch.compile(loss.fused_chunk_math, dynamic=False),
                             args.compiled_chunk, args, cast)
        in_place = best_seconds(torch.compile(loss.chunk_math, dynamic=False),
                                args.compiled_chunk, args, cast)
        print(f"    {str(dtype):<16} fused {fused * 1e3:7.0f} ms, in place {in_place * 1e3:7.0f} "
              f"ms: fused faster by {in_place / fused:.2f}x")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4096,
                        help="tokens per step (tiny.yaml: 4,096)")
    parser.add_argument("--width", type=int, default=64, help="hidden width (tiny.yaml: 64)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compiled-chunk", type=int, default=1024,
                        help="tokens per chunk of the compiled rows (tiny.yaml's loss_chunk_size)")
    parser.add_argument("--no-compiled", action="store_true", help="skip the compiled rows")
    args = parser.parse_args(argv)
    check_counts(args, "tokens", "width", "repeats", "compiled_chunk")
    gen = torch.Generator().manual_seed(0)
    tensors = (torch.randn(args.tokens, args.width, generator=gen),
               torch.randn(PADDED_VOCAB, args.width, generator=gen) * 0.02,
               torch.zeros(PADDED_VOCAB),
               torch.randint(0, PADDED_VOCAB, (args.tokens,), generator=gen))
    fitted = loss.cache_fitted_chunk(PADDED_VOCAB)
    print(f"{device_name(torch.device('cpu'))}, native bf16: {cpu_has_native_bf16()}")
    print(f"{args.tokens:,} tokens x width {args.width} x vocab {PADDED_VOCAB:,}, "
          f"{torch.get_num_threads()} threads, cache-fitted chunk {fitted} tokens; "
          f"best of {args.repeats}")
    ours = best_seconds(loss.chunk_math, fitted, args, tensors)
    print(f"  {'loss':<40}{'chunk':>7}{'ms':>9}{'ours faster by':>16}")
    print(f"  {'model/loss.py (in place)':<40}{fitted:>7}{ours * 1e3:>9.0f}{'':>16}")
    for name, math in (("model/loss.py (in place)", loss.chunk_math),
                       ("earlier math (one-hot mask, where)", earlier_chunk_math)):
        for chunk in (1024, 4096):
            seconds = best_seconds(math, chunk, args, tensors)
            print(f"  {name:<40}{chunk:>7}{seconds * 1e3:>9.0f}{seconds / ours:>15.2f}x")
    if not args.no_compiled:
        compiled_rows(args, tensors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
