"""The training step's speed levers (trainer/speed.py) change no number beyond their arithmetic:
a real DeepSpeed engine over AOGPT (one process) trains 4 optimizer steps of 2 micro-steps from
the same weights and data with a lever and without it, as trainer/loop.py drives it, and the
losses, weights and EMA agree within the rounding the lever's arithmetic allows. CUDA-only
levers are one warning line on a CPU and leave the step as it is (on a GPU, `pytest -m gpu`
trains with them as with the others)."""

import dataclasses

import pytest
import torch
from trainer_testing import one_process_group

from aogpt import UsageError
from aogpt.model import AOGPT, ModelConfig
from aogpt.trainer import speed
from aogpt.trainer.config import RunConfig
from aogpt.trainer.ds_config import resolve_ds_config
from aogpt.trainer.ema import ShardedEMA, gather_full_weights
from aogpt.trainer.loop import start_engine

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
TINY = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, cond_dim=8, vocab_size=64,
                   loss_chunk_size=8)
MICRO, ACCUM, STEPS = 2, 2, 4


@pytest.fixture(scope="module", autouse=True)
def process_group():
    with one_process_group():
        yield


def run_config(**levers) -> RunConfig:
    cfg = RunConfig(model=TINY)
    cfg.train.micro_batch_size, cfg.train.tokens_per_step = MICRO, MICRO * ACCUM * 16
    cfg.train.precision, cfg.train.compile, cfg.optim.lr = "fp32", False, 1e-2
    cfg.speed = dataclasses.replace(cfg.speed, **levers)
    return cfg


def engine_for(cfg: RunConfig, stage: int, device: torch.device):
    """The trainer's engine for `cfg` (trainer/loop.py's start_engine, the speed levers
    included) over the same initial weights, and its EMA as the Trainer fuses it."""
    torch.manual_seed(0)
    ds_config = resolve_ds_config({"zero_optimization": {"stage": stage},
                                   "steps_per_print": 10**9}, cfg, world_size=1)
    engine = start_engine(AOGPT(TINY).to(device), cfg, ds_config, device)
    ema = ShardedEMA(engine, decay=0.5)
    speed.fuse_ema(engine, ema, cfg)
    return engine, ema


def train(cfg: RunConfig, stage: int, device: str = "cpu",
          allocate_grads: bool = False) -> tuple[list[float], dict, dict]:
    """Each micro-step's loss, then the weights and the EMA after STEPS optimizer steps
    (allocate_grads: every .grad allocated before each micro-step, as speed.cuda_graphs does)."""
    engine, ema = engine_for(cfg, stage, torch.device(device))
    reduction, losses = speed.Reduction(engine, cfg.speed.coalesce_grad_reduction), []
    generator = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        speed.set_lr(engine.optimizer, 1e-2 * (step + 1) / STEPS)  # a warm-up, as trained
        with reduction.micro_steps():
            for _ in range(ACCUM):
                idx = torch.randint(0, TINY.vocab_size, (MICRO, 16), generator=generator)
                orders = torch.rand(MICRO, 16, generator=generator).argsort(dim=1)
                if allocate_grads:
                    speed.allocate_grads(engine.module)
                _, loss = engine(idx.to(device), orders.to(device), return_mean=True)
                engine.backward(loss)
                reduction.after_backward()
                losses.append(loss.item())
        ema.update()
    weights = gather_full_weights(engine)
    with ema.swapped_in():
        return losses, weights, gather_full_weights(engine)


@pytest.mark.parametrize("stage", [1, 2])
def test_grads_allocated_before_each_micro_step_train_bit_for_bit_as_before(stage):
    """speed.cuda_graphs gives every parameter a zero .grad before each micro-step (autograd then
    adds into it, never installing a CUDA graph's output buffer as .grad): DeepSpeed's ZeRO-1
    and ZeRO-2 take such grads and train exactly as without them (0 + g is g)."""
    cfg = run_config()
    assert_same_training(train(cfg, stage, allocate_grads=True), train(cfg, stage), 0, 0)


def assert_same_training(lever: tuple, default: tuple, loss_rtol: float, atol: float) -> None:
    (losses, weights, ema), (losses0, weights0, ema0) = lever, default
    assert losses == pytest.approx(losses0, rel=loss_rtol)
    for name in weights0:
        torch.testing.assert_close(weights[name], weights0[name], rtol=0, atol=atol, msg=name)
        torch.testing.assert_close(ema[name], ema0[name], rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("stage", [1, pytest.param(2, marks=pytest.mark.slow)])  # ~4 s each
def test_one_reduction_per_step_trains_as_a_reduction_per_micro_step(stage):
    """Coalesced, the two micro-steps' fp32 gradients are summed before the (one-rank)
    reduction instead of after it: the same two terms, so the same sums to an ulp; an ulp of a
    gradient moves AdamW's update by ~2^-23 of lr, ~1e-9 of a weight over 4 steps. A missed
    micro-step halves a gradient: O(1e-2)."""
    assert_same_training(train(run_config(coalesce_grad_reduction=True), stage),
                         train(run_config(), stage), loss_rtol=1e-6, atol=1e-7)


def test_one_reduction_per_step_is_refused_under_deepspeeds_bf16_optimizer():
    cfg = run_config(coalesce_grad_reduction=True)
    cfg.train.precision = "bf16"
    with pytest.raises(UsageError, match="speed.coalesce_grad_reduction needs DeepSpeed's fp32"):
        resolve_ds_config({"zero_optimization": {"stage": 1}}, cfg, world_size=1)


@pytest.mark.slow  # inductor compiles the optimizer's step with the EMA: ~30-60 s on 2 cores
def test_the_optimizer_and_the_ema_in_one_pass_train_as_torchs_fused_adamw_and_the_ema():
    """torch's multi-tensor AdamW compiled, against its fused kernel: the same formula in another
    order of fp32 roundings, a few ulps of each update (lr x ~1, at most 1e-2 here), so ~1e-8
    of a weight per step; the EMA's lerp written as shadow + w (master - shadow) rounds ~1 ulp
    otherwise than lerp for w >= 0.5 (weights < 1.1: ~1e-7). 1e-6 leaves room for 4 steps; a
    wrong decay or a missed update moves the EMA by >= 1e-3."""
    assert_same_training(train(run_config(fused_optimizer_ema=True), 1),
                         train(run_config(), 1), loss_rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # inductor compiles the whole model, forward and backward: ~1-2 min
def test_deepspeeds_compiled_model_and_autograd_train_as_the_eager_model():
    """engine.compile with compiled autograd: inductor fuses and reorders the fp32 arithmetic of
    forward and backward (each of ~100 rounded ops per micro-step may move by an ulp, partly
    cancelling): the losses of 4 steps at lr 1e-2 agree to ~1e-6 of their size, the weights to
    ~1e-6; 2e-5 and 2e-5 leave room. A wrong gradient moves them by >= 1e-3."""
    cfg = run_config(engine_compile="compiled_autograd")
    cfg.train.compile = True
    assert_same_training(train(cfg, 1), train(run_config(), 1), loss_rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("levers, line", [
    ({"cuda_graphs": True}, "speed.cuda_graphs needs a CUDA GPU"),
    ({"engine_compile": "deepcompile"}, "speed.engine_compile=deepcompile needs a CUDA GPU"),
])
def test_a_cuda_only_lever_on_a_cpu_is_one_warning_and_the_step_as_it_is(levers, line):
    cfg = run_config(**levers)
    cfg.train.compile = True
    cpu = torch.device("cpu")
    (warning,) = speed.unavailable(cfg, cpu)
    assert warning.startswith(line)
    assert not speed.engine_compiles(cfg, cpu)  # compile_for_training's graphs, as without it
    assert speed.engine_ds_config({"a": 1}, cfg, cpu) == {"a": 1}


@pytest.mark.gpu
@pytest.mark.parametrize("levers", [{"cuda_graphs": True}, {"engine_compile": "deepcompile"}],
                         ids=["cuda-graphs", "deepcompile"])
def test_a_cuda_only_lever_on_a_gpu_trains_as_the_compiled_default(levers):
    """fp32 on a GPU, the lever's compiled arithmetic against train.compile_scope's (the bound
    of the compiled-autograd test above: inductor's fusions in either)."""
    cfg, default = run_config(**levers), run_config()
    cfg.train.compile = default.train.compile = True
    assert_same_training(train(cfg, 1, "cuda"), train(default, 1, "cuda"), loss_rtol=2e-5,
                         atol=2e-5)
