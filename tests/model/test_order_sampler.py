"""Each order kind draws the orders it claims, reproducibly from (seed, step, sample index)."""

import json
import math

import numpy as np
import pytest
import torch
from vocabulary_testing import order_configs

from aogpt import UsageError
from aogpt.model import OrderConfig, OrderSampler

N = 32  # sequence length


def draw(step=0, b=8, seq_len=N, seed=0, **config):
    return OrderSampler(OrderConfig(**config), seq_len, seed)(step, torch.arange(b))


def is_permutation(orders: torch.Tensor) -> bool:
    return torch.equal(orders.sort(dim=1).values, torch.arange(orders.size(1)).expand_as(orders))


CONFIGS = order_configs(8)  # every order kind (ORDER_KINDS), so a new one is held to this too


@pytest.mark.parametrize("name", CONFIGS)
def test_every_kind_draws_permutations_that_depend_only_on_the_sample_and_step(name):
    sampler = OrderSampler(CONFIGS[name], N, seed=4)
    indices = torch.tensor([5, 900, 17, 3, 40_000, 8])
    orders, is_l2r = sampler(3, indices)
    assert orders.shape == (6, N) and orders.dtype == torch.int64 and is_permutation(orders)
    assert torch.equal(is_l2r, (orders == torch.arange(N)).all(dim=1))
    for i in (0, 4):  # drawn alone, or among other samples: the same order
        alone, alone_l2r = sampler(3, indices[i:i + 1])
        assert torch.equal(alone[0], orders[i]) and bool(alone_l2r[0]) == bool(is_l2r[i])


def test_l2r_orders_are_the_identity():
    orders, is_l2r = draw(kind="l2r")
    assert torch.equal(orders, torch.arange(N).expand(8, N)) and is_l2r.all()


def test_uniform_orders_are_distinct_permutations_per_sample_and_step():
    orders, is_l2r = draw(kind="uniform")
    assert orders.dtype == torch.int64 and orders.shape == (8, N)
    assert is_permutation(orders) and not is_l2r.any()
    assert len({tuple(o.tolist()) for o in orders}) == 8
    assert not torch.equal(draw(step=1, kind="uniform")[0], orders)
    assert not torch.equal(draw(seed=1, kind="uniform")[0], orders)


def test_uniform_orders_put_every_position_first_about_equally_often():
    orders, _ = draw(b=6400, seq_len=8, kind="uniform")
    counts = torch.bincount(orders[:, 0], minlength=8).double()
    assert (counts - 800).abs().max() < 5 * math.sqrt(800)


def test_a_sample_gets_the_same_order_in_any_batch_or_rank():
    sampler = OrderSampler(OrderConfig(kind="mixture", p_left_to_right=0.5), N, seed=7)
    whole, whole_l2r = sampler(12, torch.arange(8))
    alone = torch.cat([sampler(12, torch.tensor([i]))[0] for i in range(8)])
    # two "ranks" holding interleaved halves of the global batch, asked in another call order
    rank1, l2r1 = sampler(12, torch.arange(1, 8, 2))
    rank0, l2r0 = sampler(12, torch.arange(0, 8, 2))
    assert torch.equal(alone, whole)
    assert torch.equal(rank0, whole[0::2]) and torch.equal(rank1, whole[1::2])
    assert torch.equal(l2r0, whole_l2r[0::2]) and torch.equal(l2r1, whole_l2r[1::2])
    fresh = OrderSampler(OrderConfig(kind="mixture", p_left_to_right=0.5), N, seed=7)
    assert torch.equal(fresh(12, torch.arange(8))[0], whole)  # no hidden state: resume-safe


def test_mixture_is_left_to_right_with_probability_p():
    orders, is_l2r = draw(b=20_000, kind="mixture", p_left_to_right=0.1)
    identity = torch.arange(N).expand_as(orders)
    assert torch.equal((orders == identity).all(dim=1), is_l2r)
    assert abs(is_l2r.double().mean().item() - 0.1) < 4 * math.sqrt(0.1 * 0.9 / 20_000)
    assert is_permutation(orders[~is_l2r])


def test_fixed_order_is_one_permutation_from_its_seed():
    orders, is_l2r = draw(kind="fixed", fixed_seed=3)
    later, _ = draw(step=99, seed=5, kind="fixed", fixed_seed=3)
    assert is_permutation(orders) and (orders == orders[0]).all() and not is_l2r.any()
    assert torch.equal(later, orders)
    assert not torch.equal(draw(kind="fixed", fixed_seed=4)[0][0], orders[0])


@pytest.mark.parametrize("suffix", [".txt", ".json", ".npy"])
def test_fixed_order_from_a_file(tmp_path, suffix):
    order = torch.randperm(N).tolist()
    path = tmp_path / f"order{suffix}"
    if suffix == ".txt":
        path.write_text(" ".join(map(str, order)))
    elif suffix == ".json":
        path.write_text(json.dumps(order))
    else:
        np.save(path, np.array(order))
    orders, _ = draw(kind="fixed", fixed_file=str(path))
    assert orders.tolist() == [order] * 8


@pytest.mark.parametrize("content, message", [
    ("[0, 1, 1]", "not a permutation"),
    ("[0, 1]", "not a permutation"),
    ('{"order": [0, 1, 2]}', "flat list"),
    ("[0, 1, 2.5]", "flat list"),
])
def test_a_fixed_file_that_is_not_a_permutation_is_a_usage_error(tmp_path, content, message):
    path = tmp_path / "order.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        draw(seq_len=3, kind="fixed", fixed_file=str(path))


def test_a_missing_fixed_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        draw(kind="fixed", fixed_file=str(tmp_path / "absent.txt"))


def test_blockwise_within_blocks_keeps_blocks_in_order_shuffled_inside():
    orders, is_l2r = draw(kind="blockwise", block_size=8, block_mode="within_blocks",
                          blockwise_fixed=False)
    blocks = orders.view(8, 4, 8)
    assert torch.equal(blocks.div(8, rounding_mode="floor"),
                       torch.arange(4)[:, None].expand(8, 4, 8))
    assert not is_l2r.any() and is_permutation(orders)
    assert not torch.equal(blocks.sort(dim=2).values, blocks)  # shuffled inside
    assert len({tuple(o.tolist()) for o in orders}) == 8  # a fresh order per sample


def test_blockwise_across_blocks_shuffles_whole_blocks_left_to_right_inside():
    orders, _ = draw(kind="blockwise", block_size=8, block_mode="across_blocks",
                     blockwise_fixed=False)
    blocks = orders.view(8, 4, 8)
    starts = blocks[:, :, :1]
    assert torch.equal(blocks, starts + torch.arange(8)) and torch.all(starts % 8 == 0)
    assert is_permutation(orders) and not torch.equal(orders, torch.arange(N).expand(8, N))


def test_blockwise_fixed_draws_one_block_order_from_fixed_seed():
    orders, _ = draw(kind="blockwise", block_size=8, fixed_seed=2)
    assert (orders == orders[0]).all() and torch.equal(draw(step=5, kind="blockwise", block_size=8,
                                                            fixed_seed=2)[0], orders)


def test_schedules_move_p_from_start_to_end():
    def p(schedule, step):
        config = OrderConfig(schedule=schedule, p_left_to_right=1.0, p_left_to_right_end=0.2,
                             schedule_steps=100)
        return OrderSampler(config, N, 0).p_left_to_right(step)

    assert [p("constant", s) for s in (0, 50, 500)] == [1.0, 1.0, 1.0]
    assert [p("linear", s) for s in (0, 50, 100, 500)] == pytest.approx([1.0, 0.6, 0.2, 0.2])
    assert [p("step", s) for s in (0, 99, 100, 500)] == [1.0, 1.0, 0.2, 0.2]
    assert [p("cosine", s) for s in (0, 50, 100, 500)] == pytest.approx([1.0, 0.6, 0.2, 0.2])
    assert p("cosine", 25) == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi / 4)))


def test_the_planner_kind_draws_uniform_orders_where_no_planner_runs():
    """Without the model and tokens (model/planned_orders.py plans the p_planner share), the
    planner kind's orders are the uniformly random ones its unplanned sequences are read in."""
    planned, uniform = draw(step=3, kind="planner"), draw(step=3, kind="uniform")
    assert torch.equal(planned[0], uniform[0]) and not planned[1].any()


def test_mixture_follows_the_schedule():
    config = dict(kind="mixture", schedule="step", p_left_to_right=1.0, p_left_to_right_end=0.0,
                  schedule_steps=10)
    assert draw(step=9, b=64, **config)[1].all()
    assert not draw(step=10, b=64, **config)[1].any()


@pytest.mark.parametrize("config, message", [
    (dict(kind="blockwise", block_size=5), "divide"),
    (dict(p_left_to_right=1.5), "p_left_to_right"),
    (dict(schedule="linear"), "schedule_steps"),
    (dict(kind="uniform", fixed_file="x.txt"), "fixed_file"),
    (dict(kind="planner", p_planner=-0.1), "p_planner"),
    (dict(kind="planner", refresh=0), "refresh"),
    (dict(kind="planner", planner_givens=[5, 2]), "planner_givens"),
    (dict(kind="planner", planner_givens=[0, N]), "planner_givens"),
    (dict(kind="planner", planner_givens=[3]), "planner_givens"),
    (dict(weighting="bell", bell_width=0), "bell_width"),
])
def test_bad_order_configs_are_usage_errors(config, message):
    with pytest.raises(UsageError, match=message):
        OrderSampler(OrderConfig(**config), N, 0)
