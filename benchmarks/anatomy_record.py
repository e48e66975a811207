"""The kernels of a real training step and of a real decode call, recorded on this machine as a
GPU would run them (benchmarks/kernel_census.py): what benchmarks/step_anatomy.py predicts from.

The training step is trainer/loop.py's own (`Trainer.train_step`), built by trainer/main.py's
pre-flight from a preset, with its parts marked by what they do (orders, forward, loss,
backward, optimizer: the optimizer, DeepSpeed's step, the bad-step watch and the EMA). Where a
CPU takes another path to the same numbers than a GPU, the GPU's is recorded:

- the chunked loss runs the preset's chunks (a CPU caps them to its cache, model/loss.py), and
  the head's weight gradient is one fp32-accumulating matmul (a CPU makes a bf16 product, casts
  it and adds it: three kernels, two passes over vocab x d fp32);
- the decode call attends through SDPA with the mask as an additive bias, to the GPU's
  bucketed keys (a CPU attends to the whole cache with the plain computation).

What stays a CPU's: inductor's C++ code generation fuses as Triton does (same scheduler), but
keeps a reduction whole where Triton splits one of few outputs in two (roofline.launches counts
those), and the kernels around attention differ (the CPU's flash attention is one library call
each way, as a GPU's is); autocast follows the CPU's op lists, which put matmuls and attention
in bf16 as CUDA's do.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from kernel_census import Kernel, KernelCensus


def _mark(owner, method: str, census: KernelCensus, phase: str, before=None) -> None:
    """owner.method runs in `phase` (an instance attribute over the class's method); `before()`
    first."""
    original = getattr(owner, method)

    def marked(*args, **kwargs):
        if before is not None:
            before()
        with census.phase(phase):
            return original(*args, **kwargs)

    setattr(owner, method, marked)


def _loss_backward_in_phase(census: KernelCensus, loss: torch.Tensor) -> None:
    """The loss's own backward (the scaling of the gradients its forward made) in "loss"."""
    saved = []

    def enter(grads) -> None:
        saved.append(census.enter_phase("loss"))

    def leave(inputs, outputs) -> None:
        census.enter_phase(saved.pop())

    loss.grad_fn.register_prehook(enter)
    loss.grad_fn.register_hook(leave)


def mark_trainer(trainer, census: KernelCensus) -> None:
    """Marks each part of the trainer's step with what it does, and counts its micro-steps."""
    engine, head = trainer.engine, trainer.engine.module.lm_head
    draw = trainer.orders

    def orders(*args, **kwargs):  # a micro-step's first work
        census.micro += 1
        with census.phase("orders"):
            return draw(*args, **kwargs)

    trainer.orders = orders
    _mark(engine, "forward", census, "forward")
    original_head = head.forward

    def head_forward(*args, **kwargs):
        with census.phase("loss"):
            out = original_head(*args, **kwargs)
        if isinstance(out, tuple) and out[1].grad_fn is not None:
            _loss_backward_in_phase(census, out[1])
        return out

    head.forward = head_forward
    _mark(engine, "backward", census, "backward")
    _mark(engine, "step", census, "optimizer")
    _mark(trainer.recovery, "note", census, "optimizer",
          before=lambda: setattr(census, "micro", -1))
    if trainer.ema is not None:
        _mark(trainer.ema, "update", census, "optimizer")


@contextlib.contextmanager
def gpu_loss_path(census: KernelCensus) -> Iterator[None]:
    """The chunked loss as a GPU runs it (see the module's docstring)."""
    from aogpt.model import loss

    chunk, add = loss.cache_fitted_chunk, loss._add_weight_grad

    def fp32_accumulating_add(grad_w, grad_logits, h):
        # grad_w (vocab, d) fp32 += grad_logits.T (vocab, n) @ h (n, d), bf16 in, fp32 sums
        vocab, d = grad_w.shape
        moved = (grad_logits.numel() * grad_logits.element_size()
                 + h.numel() * h.element_size() + 2 * grad_w.numel() * grad_w.element_size())
        kernel = Kernel("addmm (fp32 accumulation)", "", False, 2.0 * vocab * d * len(h),
                        float(moved), ("addmm",), matmul=(1, vocab, d, len(h)))
        with census.substituted(kernel):
            add(grad_w, grad_logits, h)

    loss.cache_fitted_chunk = lambda vocab: 1 << 30
    loss._add_weight_grad = fp32_accumulating_add
    try:
        yield
    finally:
        loss.cache_fitted_chunk, loss._add_weight_grad = chunk, add


def trainer_plan(config: str, ds_config: str, overrides: list[str], out_dir: Path, dist_env):
    """The pre-flight's plan (trainer/preflight.py) of a throwaway run: no evaluation, no
    checkpoint to resume, nothing logged to wandb."""
    from aogpt.trainer.preflight import preflight

    return preflight(config, ds_config, [*overrides, f"out_dir={out_dir}", "eval.every=0",
                                         "eval.sets=[]", "logging.wandb='off'",
                                         "train.log_every=1000000"], dist_env)


def record_training_step(config: str, ds_config: str, overrides: list[str]) -> list[Kernel]:
    """The kernels of the trainer's second optimizer step (the first compiles), on this machine's
    device, each marked with its phase and micro-step."""
    from aogpt.trainer.dist_env import setup_distributed_env
    from aogpt.trainer.loop import Trainer

    census = KernelCensus()
    with tempfile.TemporaryDirectory(prefix="aogpt_anatomy_") as scratch:
        dist_env = setup_distributed_env()
        plan = trainer_plan(config, ds_config, overrides, Path(scratch) / "run", dist_env)
        trainer = Trainer(plan, dist_env)
        try:
            mark_trainer(trainer, census)
            with census.compiling(), gpu_loss_path(census):
                trainer.train_step(0)
                census.micro = -1
                with census:
                    trainer.train_step(1)
        finally:
            trainer.close()
    return census.kernels


@contextlib.contextmanager
def sdpa_with_a_bias() -> Iterator[None]:
    """Masked bf16 attention through SDPA with the additive bias, a GPU's branch of
    attention.attend (a CPU takes the plain computation there)."""
    from aogpt.model import attention

    plain = attention.math_attention

    def through_sdpa(q, k, v, mask=None):
        if isinstance(mask, torch.Tensor) and mask.dtype == q.dtype:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return plain(q, k, v, mask)

    attention.math_attention = through_sdpa
    try:
        yield
    finally:
        attention.math_attention = plain


def record_decode_call(preset: str, batch: int, seq_len: int, known: int,
                       targets: int) -> list[Kernel]:
    """The kernels of one compiled decode call of the sampler, in bf16, as a GPU runs it."""
    from decode_state import sampler_at_step, step_shape

    from aogpt.model import AOGPT
    from aogpt.model.config import medium, small, tiny

    config = {"tiny": tiny, "small": small, "medium": medium}[preset]()
    torch.manual_seed(0)
    model = AOGPT(config).to(torch.bfloat16).eval()
    census = KernelCensus()
    shape = step_shape(seq_len, known, targets, on_gpu=True)
    with torch.no_grad(), census.compiling(), sdpa_with_a_bias():
        sampler = sampler_at_step(model, batch, seq_len, known, targets, compiled=True,
                                  graphs=False)
        sampler.call(*shape)
        with census, census.phase("decode"):
            sampler.call(*shape)
    if not sampler.compiled:
        raise RuntimeError("the decode call fell back to eager: see the warning above")
    return census.kernels
