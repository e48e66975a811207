"""The sharded EMA against a plain full-weight EMA, under every ZeRO stage and precision, on a real
DeepSpeed engine over AOGPT (one process; tests/trainer/test_train_runs.py covers 2 ranks)."""

import os
from pathlib import Path

import deepspeed
import pytest
import torch
from trainer_testing import one_process_group

from aogpt import UsageError
from aogpt.model import AOGPT, ModelConfig
from aogpt.trainer.ema import ShardedEMA, gather_full_weights

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
TINY = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, cond_dim=8, loss_chunk_size=0)
SIGMA = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, target_injection="sigma_sum",
                    norm="layer", qk_norm=False, bias=False, tie_embeddings=True,
                    lm_head_bias=False)


@pytest.fixture(scope="module", autouse=True)
def process_group():
    with one_process_group():
        yield


def test_the_trainers_process_group_builds_no_inference_op_and_no_dev_shm_workspace():
    """DeepSpeed's CPU backend would compile its shared-memory op for inference_all_reduce
    (~80 s on 2 cores, once per machine and environment) and map a /dev/shm workspace per rank:
    the trainer never calls that collective (trainer/lean_start.py)."""
    assert deepspeed.comm.comm.cdb.shm_comm_op is None
    assert not hasattr(torch.ops.deepspeed, "inference_all_reduce_")
    port = os.environ["MASTER_PORT"]
    assert not list(Path("/dev/shm").glob(f"deepspeed_*_{port}_*"))


def test_an_adamw_engine_leaves_deepspeeds_muon_functions_uncompiled():
    """Every engine imports DeepSpeed's Muon module, which wrapped three functions in
    torch.compile at import (loading inductor, ~2 s per rank): the trainer's process group defers
    that to their first call (trainer/lean_start.py), which an AdamW run never makes."""
    train_step(engine_for(TINY, 2, False))
    from deepspeed.runtime.zero.muon import original_muon

    for name in ("zeropower_via_newtonschulz5", "zeropower_via_gram_newtonschulz", "muon_update"):
        function = getattr(original_muon, name)
        assert not hasattr(function, "_torchdynamo_orig_callable"), f"{name} was compiled"
        assert function.__wrapped__.__module__ == original_muon.__name__


def engine_for(config: ModelConfig, stage: int, bf16: bool):
    torch.manual_seed(0)
    model = AOGPT(config)
    optimizer = torch.optim.AdamW(model.param_groups(0.1), lr=1e-2)
    ds = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
          "zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16},
          "steps_per_print": 10**9}
    if bf16:
        ds["data_types"] = {"grad_accum_dtype": "fp32"}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds)
    return engine


def train_step(engine) -> None:
    idx = torch.randint(0, 50257, (2, 16))
    orders = torch.stack([torch.randperm(16) for _ in range(2)])
    engine.backward(engine(idx, orders).mean())
    engine.step()


@pytest.mark.parametrize("config, stage, bf16", [
    (TINY, 1, False), (TINY, 2, False), (TINY, 3, False),
    (TINY, 1, True),  # ZeRO-1 + bf16 + fp32 accumulation runs DeepSpeed's BF16_Optimizer
    (TINY, 3, True), (SIGMA, 2, False),
], ids=["zero1", "zero2", "zero3", "zero1-bf16", "zero3-bf16", "zero2-tied"])
def test_sharded_ema_equals_a_full_weight_ema(config, stage, bf16):
    engine = engine_for(config, stage, bf16)
    ema = ShardedEMA(engine, decay=0.2)
    expected = {k: v.double() for k, v in gather_full_weights(engine).items()}  # exact, nearly
    for n in (1, 2, 3):
        train_step(engine)
        ema.update()
        decay = min(0.2, (1 + n) / (10 + n))  # warm-up at n = 1, the cap after
        assert ema.current_decay() == decay
        raw = gather_full_weights(engine)
        expected = {k: v + (1 - decay) * (raw[k].double() - v) for k, v in expected.items()}
    with ema.swapped_in():
        averaged = gather_full_weights(engine)
    assert averaged.keys() == expected.keys()
    # The EMA's fp32 lerp rounds ~1.5 ulps per update (its formula and FMA use differ between
    # CPUs); weights are below ~1.1 (norms start at 1), so 3 updates are off by < 5 x 2^-23
    # ~ 6e-7 from the float64 reference. An fp32 reference would add as much again. A wrong
    # decay moves a weight by >= 0.02 x its ~1e-2 change per step, 2e-4; bf16 weights in the
    # EMA by 2^-9 of a weight, up to 2e-3.
    for name, value in expected.items():
        torch.testing.assert_close(averaged[name].double(), value, rtol=0, atol=1e-6, msg=name)
    for name, value in gather_full_weights(engine).items():  # the swap was undone
        assert torch.equal(value, raw[name]), name
    plain = AOGPT(config)
    plain.load_state_dict(averaged, strict=True)  # tied weights appear under both names


def test_ema_state_restores_into_a_fresh_engine_and_refuses_another_layout():
    engine = engine_for(TINY, 2, False)
    ema = ShardedEMA(engine, decay=0.9)
    train_step(engine)
    ema.update()
    state = ema.state_dict()
    fresh = ShardedEMA(engine_for(TINY, 2, False), decay=0.9)
    fresh.load_state_dict(state)
    assert fresh.num_updates == 1
    assert all(torch.equal(a, b) for a, b in zip(fresh.shadow, ema.shadow, strict=True))
    state["shadow"] = [t[:-1] for t in state["shadow"]]
    with pytest.raises(UsageError, match="same world size and ZeRO stage"):
        fresh.load_state_dict(state)
