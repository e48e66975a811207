"""The trainer's per-step work outside the model (the EMA update) and evaluation's scoring stay
on the device of their tensors and never read it: checked on `meta` (tests/device_testing.py).

Not exercisable on meta, by design: the ensemble's target choice (torch.nonzero: its output's
size depends on the lengths) and its packing of member rows into forwards (.tolist() of the
chosen targets' lengths) read the device once per batch; Tally.reduced reads the sums once
per evaluation; ShardedEMA.state_dict copies the shadow to the CPU for a checkpoint.
"""

from types import SimpleNamespace

import pytest
import torch
from device_testing import META, DeviceCrossings, let_meta_run_without_autocast, tiny_meta_model

from aogpt.model import OrderConfig, OrderSampler
from aogpt.trainer.ema import ShardedEMA
from aogpt.trainer.ensemble import ensemble_sums, last_slot_nll, member_orders
from aogpt.trainer.evaluation import EvalSettings, Evaluator, Tally, real_first

N, B = 16, 3  # sequence length, batch


@pytest.fixture(autouse=True)
def meta_without_autocast(monkeypatch):
    let_meta_run_without_autocast(monkeypatch)


def engine_with_master_partitions(*numels: int):
    """What ShardedEMA reads of a DeepSpeed ZeRO-1/2 engine: flat fp32 master partitions."""
    partitions = [torch.zeros(n, device=META) for n in numels]
    return SimpleNamespace(optimizer=SimpleNamespace(single_partition_of_fp32_groups=partitions))


def test_the_ema_update_stays_on_the_device_of_the_master_weights():
    ema = ShardedEMA(engine_with_master_partitions(10, 3), decay=0.999)
    with DeviceCrossings() as crossings:
        for _ in range(3):
            ema.update()
        with ema.swapped_in():
            pass
    assert [t.device for t in ema.shadow] == [META, META] and ema.num_updates == 3
    assert crossings.ops == []


def meta_eval_batch(lengths: list[int]):
    """sample_indices (b,), token ids (b, n), lengths (b,), all on meta."""
    sample_indices = torch.arange(5, 5 + len(lengths), device=META)
    idx = torch.zeros(len(lengths), N, dtype=torch.long, device=META)
    return sample_indices, idx, torch.tensor(lengths).to(META)


@pytest.mark.parametrize("orders", [("l2r",), ("random",), ("l2r", "random")], ids="+".join)
def test_scoring_a_batch_in_l2r_and_random_orders_never_reads_the_device(orders):
    model = tiny_meta_model(block_size=N).eval()
    settings = EvalSettings(orders=orders, num_orders=2)
    evaluator = Evaluator(model, settings, META)
    tallies = {"l2r": Tally(torch.zeros(2, dtype=torch.float64, device=META)),
               "random": Tally(torch.zeros(2, 2, dtype=torch.float64, device=META))}
    tallies = {kind: tallies[kind] for kind in orders}
    sampler = OrderSampler(OrderConfig(kind="uniform"), N, settings.seed)
    batch = meta_eval_batch([N, N - 5, 3])
    with DeviceCrossings() as crossings, torch.inference_mode():
        evaluator.score_batch(sampler, tallies, *batch)
    forwards = {"l2r": B, "random": settings.num_orders * B}
    for kind, tally in tallies.items():
        assert tally.sums.device == META and tally.forwards == forwards[kind]
    assert crossings.ops == []


def test_the_ensembles_orders_and_scores_stay_on_the_device():
    model = tiny_meta_model(block_size=N).eval()
    sample_indices, idx, lengths = meta_eval_batch([N, N - 5, 3])
    base_orders = torch.arange(N, device=META).flip(0).expand(B, N)
    units = torch.tensor([0, 0, 1, 2]).to(META)  # (U,): the sample of each scored target
    targets = torch.tensor([3, 9, 2, 1]).to(META)
    members = torch.tensor([1, 2, 1, 2]).to(META)
    with DeviceCrossings() as crossings, torch.inference_mode():
        real = real_first(base_orders, lengths)
        orders = member_orders(real[units], sample_indices[units], targets, members, seed=0,
                               length=10)
        nll, hidden = last_slot_nll(model, idx[units], orders, targets)
        sums = ensemble_sums(torch.stack([nll, nll], dim=1).double(), units,
                             lengths.clamp(max=2), lengths, sizes=(1, 2))
    assert (real.device, orders.device, orders.shape) == (META, META, (4, 10))
    assert (nll.device, nll.shape, hidden.shape) == (META, (4,), (4, model.config.n_embd))
    assert (sums.device, sums.dtype, sums.shape) == (META, torch.float64, (2, 2))
    assert crossings.ops == []
