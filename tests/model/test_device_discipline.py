"""What runs every micro-step or generation step stays on the device of its inputs and never
reads it: checked on the `meta` device (see tests/device_testing.py), so no GPU is needed.

Designed exceptions, not tested here: the sampler's planning (reveal_counts, plan_steps) reads
the device once per generation, before the first step; the loss's per-token backward (a weighted
loss) checks on the device whether its gradient is uniform; CUDA graphs need a CUDA device.
"""

import pytest
import torch
from device_testing import META, DeviceCrossings, let_meta_run_without_autocast, tiny_meta_model
from vocabulary_testing import order_configs

import aogpt.model.sampler.parallel as sampler_module
from aogpt.model import OrderConfig, OrderSampler
from aogpt.model.sampler import KVCacheSampler, SamplingConfig
from aogpt.model.sampler.parallel import reveal_counts

N, B = 16, 4  # sequence length, batch

ORDER_CONFIGS = {
    **order_configs(4),  # every kind, and blockwise blocks drawn afresh, a scheduled mixture
    "mixture-always-l2r": OrderConfig(kind="mixture", p_left_to_right=1.0),
    "blockwise-across-fixed": OrderConfig(kind="blockwise", block_size=4,
                                          block_mode="across_blocks"),
    **{f"mixture-{schedule}-schedule": OrderConfig(kind="mixture", p_left_to_right=0.5,
                                                   schedule=schedule, schedule_steps=10)
       for schedule in ("linear", "step")},
}


@pytest.fixture(params=[*ORDER_CONFIGS, "fixed-file"])
def order_sampler(request, tmp_path) -> OrderSampler:
    if request.param == "fixed-file":
        path = tmp_path / "order.txt"
        path.write_text(" ".join(map(str, torch.arange(N).flip(0).tolist())))
        return OrderSampler(OrderConfig(kind="fixed", fixed_file=str(path)), N, seed=3)
    return OrderSampler(ORDER_CONFIGS[request.param], N, seed=3)


@pytest.fixture(autouse=True)
def meta_without_autocast(monkeypatch):
    let_meta_run_without_autocast(monkeypatch)


def meta_batch(b: int = B, n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and (right-to-left) orders, both on meta: their values are never read."""
    orders = torch.arange(n, device=META).flip(0).expand(b, n)
    return torch.zeros(b, n, dtype=torch.long, device=META), orders


# ---- the counter itself --------------------------------------------------------------------------

M = torch.ones(4, 3, device=META)
MASK = torch.zeros(4, dtype=torch.bool, device=META)
REPEATS = torch.ones(4, dtype=torch.long, device=META)
# what makes a CUDA device wait (or copy), each as a meta step might write it: every one must
# be flagged, whether meta raises in it or runs it
WAITS = {
    "boolean-mask read": lambda: M[MASK],
    "boolean-mask write": lambda: M.clone().__setitem__(MASK, 0.0),
    "nonzero": lambda: MASK.nonzero(),
    "where without values": lambda: torch.where(MASK),
    "masked_select": lambda: M.masked_select(MASK[:, None]),
    "repeat_interleave without output_size": lambda: M.repeat_interleave(REPEATS, dim=0),
    "unique": lambda: REPEATS.unique(),
    "bincount": lambda: REPEATS.bincount(),
    ".item()": lambda: M.sum().item(),
    "torch.equal": lambda: torch.equal(M, M),
    "bool()": lambda: bool(M.sum()),
    "copy to the device": lambda: torch.ones(3).to(META),
    "copy to the host": lambda: M.cpu(),
    "indexing with a host index": lambda: M[torch.tensor([0, 2])],
}
# their sync-free forms, which must not be
NO_WAITS = {
    "masked_fill": lambda: M.masked_fill(MASK[:, None], 0.0),
    "torch.where with values": lambda: torch.where(MASK[:, None], M, 0.0),
    "repeat_interleave with output_size":
        lambda: M.repeat_interleave(REPEATS, dim=0, output_size=4),
    "indexing with a device index": lambda: M[torch.arange(2, device=META)],
    "a 0-dim host tensor as a scalar": lambda: M * torch.tensor(2.0),
}


@pytest.mark.parametrize("op", WAITS.values(), ids=WAITS.keys())
def test_the_counter_flags_what_a_cuda_device_would_wait_in(op):
    with DeviceCrossings() as crossings:
        try:
            op()
        except (RuntimeError, NotImplementedError):  # meta refuses some: flagged before
            pass
    assert len(crossings) >= 1


@pytest.mark.parametrize("op", NO_WAITS.values(), ids=NO_WAITS.keys())
def test_the_counter_lets_the_sync_free_forms_pass(op):
    with DeviceCrossings() as crossings:
        op()
    assert crossings.ops == []


# ---- training orders -----------------------------------------------------------------------------


def test_orders_and_is_l2r_come_back_on_the_device_of_the_sample_indices(order_sampler):
    for step in (0, 5, 20):  # before, inside and after any schedule
        orders, is_l2r = order_sampler(step, torch.arange(B, device=META))
        assert (orders.device, orders.dtype, orders.shape) == (META, torch.int64, (B, N))
        assert (is_l2r.device, is_l2r.dtype, is_l2r.shape) == (META, torch.bool, (B,))


def test_drawing_orders_copies_nothing_between_host_and_device(order_sampler):
    order_sampler(0, torch.arange(B, device=META))  # a fixed order's one copy to the device
    with DeviceCrossings() as crossings:
        order_sampler(7, torch.arange(B, 2 * B, device=META))
    assert crossings.ops == []


def test_a_fixed_order_is_copied_to_each_device_once():
    sampler = OrderSampler(ORDER_CONFIGS["fixed"], N, seed=3)
    with DeviceCrossings() as crossings:
        for step in range(3):
            sampler(step, torch.arange(B, device=META))
    assert len(crossings) == 1, crossings.ops
    on_cpu, _ = sampler(0, torch.arange(B))
    assert torch.equal(on_cpu, sampler(1, torch.arange(B))[0])  # the CPU's copy: the same order


# ---- training forward and loss -------------------------------------------------------------------


@pytest.mark.parametrize("given_orders", [True, False], ids=["orders", "left-to-right"])
def test_training_stream_stays_on_the_device_of_its_inputs(given_orders):
    model = tiny_meta_model()
    idx, orders = meta_batch()
    with DeviceCrossings() as crossings:
        stream = model.training_stream(idx.to(torch.uint16), orders if given_orders else None)
    for tensor in stream:  # tokens, positions, target_positions, targets
        assert (tensor.device, tensor.dtype, tensor.shape) == (META, torch.int64, (B, N))
    assert crossings.ops == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("overrides", [
    {}, {"loss_chunk_size": 0}, {"activation_checkpointing": True, "dropout": 0.1},
    {"target_injection": "sigma_sum", "norm": "layer", "qk_norm": False, "tie_embeddings": True},
], ids=["aogpt-chunked-loss", "full-logits-loss", "checkpointed-dropout", "sigma-gpt"])
def test_the_mean_loss_and_its_backward_never_read_the_device(overrides, dtype):
    model = tiny_meta_model(**overrides).to(dtype).train()
    idx, orders = meta_batch()
    with DeviceCrossings() as crossings:
        nll = model(idx, orders)
        nll, loss = model(idx, orders, return_mean=True)
        loss.backward()
    assert (nll.device, nll.dtype, nll.shape) == (META, torch.float32, (B, N))
    assert (loss.device, loss.shape) == (META, ())
    for name, param in model.named_parameters():
        assert (param.grad.device, param.grad.dtype) == (META, dtype), name
    assert crossings.ops == []


def test_the_per_token_backward_is_the_loss_path_that_reads_the_device():
    """The designed sync (a weighted loss: is its gradient uniform?), and proof that meta finds
    one."""
    model = tiny_meta_model()
    idx, orders = meta_batch()
    with pytest.raises((RuntimeError, NotImplementedError), match="meta"):
        model(idx, orders).sum().backward()


def test_the_loss_under_bf16_autocast_never_reads_the_device():
    if not torch.amp.is_autocast_available("meta"):
        pytest.skip("autocast has no meta backend in this torch: torch.autocast('meta') is refused "
                    "and autocast('cpu') leaves meta tensors in fp32; the bf16 model variant of "
                    "test_the_mean_loss_and_its_backward_never_read_the_device covers bf16 math")
    model = tiny_meta_model().train()
    idx, orders = meta_batch()
    with DeviceCrossings() as crossings, torch.autocast("meta", torch.bfloat16):
        nll, loss = model(idx, orders, return_mean=True)
    loss.backward()
    assert nll.device == META and model.lm_head.weight.grad.device == META
    assert crossings.ops == []


def test_a_plain_gpt_trains_on_identity_orders_without_reading_the_device():
    model = tiny_meta_model(target_injection="none")
    idx, _ = meta_batch()
    orders, _ = OrderSampler(OrderConfig(kind="l2r"), N, seed=0)(0, torch.arange(B, device=META))
    with DeviceCrossings() as crossings:
        model(idx, orders, return_mean=True)[1].backward()
    assert crossings.ops == []


# ---- generation steps ----------------------------------------------------------------------------

SAMPLING_CONFIGS = {
    "default": SamplingConfig(steps=4),
    "greedy": SamplingConfig(steps=4, temperature=0.0),
    "top-k-top-p": SamplingConfig(steps=4, top_k=5, top_p=0.9, temperature=0.7),
    "binomial-l2r": SamplingConfig(steps=4, counts="binomial", order="l2r"),
}


@pytest.mark.parametrize("config", SAMPLING_CONFIGS.values(), ids=SAMPLING_CONFIGS.keys())
def test_a_generation_step_stays_on_the_device_and_never_reads_it(config):
    sampler = KVCacheSampler(tiny_meta_model().eval(), batch_size=B, seq_len=N, config=config)
    with DeviceCrossings() as crossings, torch.no_grad():
        logits, target_slots, valid = sampler.call(rows=4, targets=2, keys=N)
    assert (logits.device, logits.dtype, logits.shape[:2]) == (META, torch.float32, (B, 2))
    assert (target_slots.device, valid.device, valid.dtype) == (META, META, torch.bool)
    assert sampler.ordered.device == META and sampler.cache.kv.device == META
    assert crossings.ops == []


def plan_on_host_stand_ins(config, given, seq_len, sample_ids):
    """reveal_counts reads the device once, by design: on meta there is nothing to read, so the
    plan is made from stand-in values (nothing given, sample ids 0..b-1)."""
    assert given.device == META and sample_ids.device == META
    b = len(given)
    return reveal_counts(config, torch.zeros(b, dtype=torch.long), seq_len, torch.arange(b))


@pytest.mark.parametrize("config", SAMPLING_CONFIGS.values(), ids=SAMPLING_CONFIGS.keys())
def test_generation_reads_the_device_only_to_plan_its_steps(monkeypatch, config):
    monkeypatch.setattr(sampler_module, "reveal_counts", plan_on_host_stand_ins)
    sampler = KVCacheSampler(tiny_meta_model().eval(), batch_size=B, seq_len=N, config=config)
    crossings_after_step = []
    with DeviceCrossings() as crossings:
        out = sampler.generate(torch.arange(B - 1, device=META),
                               on_step=lambda step: crossings_after_step.append(len(crossings)))
    assert (out.tokens.device, out.tokens.shape) == (META, (B - 1, N))
    assert len(crossings_after_step) == out.network_calls > 1
    # whatever crosses (the plan going to the device) does so before the first step ends
    assert set(crossings_after_step) == {len(crossings)}, crossings.ops
