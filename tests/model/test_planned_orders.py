"""Planner-aligned training orders (model/planned_orders.py): a planned sequence is read in the
order the planner takes on its own tokens (checked against full forwards), after its given
positions; the share, the givens and the ties come from (seed, step, sample index) only, so a
sample's order does not depend on its batch; the pass's cost is counted; the model goes back to
training mode."""

import pytest
import torch
from conftest import perturbed_float64_model

from aogpt.model.config import ModelConfig
from aogpt.model.orders import TRAINING_PLANNERS, OrderConfig, OrderSampler
from aogpt.model.planned_orders import TrainingOrders
from aogpt.model.sampler import PLANNERS

N, VOCAB = 10, 16


def network():
    config = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=N, cond_dim=8,
                         vocab_size=VOCAB)
    model = perturbed_float64_model(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # peaked distributions: the scores differ
    return model.train()  # as the trainer hands it over


TEXTS = torch.randint(0, VOCAB, (64, N), generator=torch.Generator().manual_seed(0))  # by id


def scores(probs: torch.Tensor, planner: str) -> torch.Tensor:
    """What each planner ranks highest first, (..., vocab) probabilities -> (...)."""
    top = probs.topk(2, dim=-1).values
    return {"confidence": top[..., 0], "margin": top[..., 0] - top[..., 1],
            "entropy": (probs * probs.log()).sum(dim=-1)}[planner]  # minus the entropy


@torch.no_grad()
def follows_the_planner(model, text: torch.Tensor, order: list[int], start: int,
                        planner: str) -> bool:
    """Whether each position of the order from `start` on is the best scored of the remaining
    ones given those before it, as full forwards score them (all in one batch: a reading per
    (known, candidate) puts the candidate right after the known positions)."""
    readings, where = [], []
    for known in range(start, N - 1):
        for position in order[known:]:
            rest = [p for p in order[known:] if p != position]
            readings.append(order[:known] + [position] + rest)
            where.append((known, position))
    logits = model.logits(text.expand(len(readings), -1), torch.tensor(readings))
    rows = torch.tensor([known for known, _ in where])
    score = scores(logits[torch.arange(len(rows)), rows].float().softmax(dim=-1), planner)
    for known in range(start, N - 1):
        scored = {position: float(score[i]) for i, (k, position) in enumerate(where)
                  if k == known}
        if scored[order[known]] < max(scored.values()) - 1e-6:
            return False
    return True


def planner_orders(model, step=0, ids=None, seed=3, **settings):
    ids = torch.arange(6) if ids is None else ids
    config = OrderConfig(kind="planner", **{"p_planner": 1.0, **settings})
    orders = TrainingOrders(config, N, seed, model)
    return orders(step, ids, TEXTS[ids]), orders


def test_training_planners_are_planners_of_the_sampler():
    assert set(TRAINING_PLANNERS) <= set(PLANNERS)


@pytest.mark.parametrize("planner", TRAINING_PLANNERS)
def test_a_planned_order_reveals_the_best_scored_position_next(planner):
    model = network()
    (orders, is_l2r), _ = planner_orders(model, planner=planner)
    assert not is_l2r.any()
    model.eval()
    for b in range(3):
        order = orders[b].tolist()
        assert sorted(order) == list(range(N))
        assert follows_the_planner(model, TEXTS[b], order, 0, planner)


def test_given_positions_come_first_in_position_order_then_the_planner_orders_the_rest():
    """Each planned sample has g in 0..4 positions given: the first g of its random order (the
    order the unplanned share would read), in position order; then the planner's choices."""
    model = network()
    ids = torch.arange(8)
    (orders, _), _ = planner_orders(model, ids=ids, planner_givens=[0, 4])
    random_orders = OrderSampler(OrderConfig(kind="planner"), N, 3)(0, ids)[0]
    model.eval()
    counts = set()
    for b in range(len(ids)):
        order, random_order = orders[b].tolist(), random_orders[b].tolist()
        fits = [g for g in range(5) if order[:g] == sorted(random_order[:g])
                and follows_the_planner(model, TEXTS[b], order, g, "margin")]
        assert fits, f"sample {b}: {order} is no planner order after a given prefix"
        counts.add(fits[0])
    assert len(counts) > 1  # the number given varies from sample to sample


def test_refresh_reveals_that_many_positions_per_scoring_at_a_fraction_of_the_rows():
    model = network()
    _, one = planner_orders(model, refresh=1)
    (orders, _), three = planner_orders(model, refresh=3)
    assert all(sorted(order) == list(range(N)) for order in orders.tolist())
    rows_one, rows_three = one.cost.report(1)["planner_rows"], three.cost.report(1)["planner_rows"]
    assert rows_three < rows_one * 0.6  # n + n^2 / (2R) rows against n (n + 1) / 2


def test_a_sample_gets_the_same_planned_order_in_any_batch_or_rank():
    model = network()
    ids = torch.tensor([7, 2, 11, 5])
    (batch, _), _ = planner_orders(model, step=4, ids=ids, p_planner=0.5, planner_givens=[1, 3])
    for i, sample in enumerate(ids.tolist()):
        (alone, _), _ = planner_orders(model, step=4, ids=torch.tensor([sample]), p_planner=0.5,
                                       planner_givens=[1, 3])
        assert torch.equal(alone[0], batch[i])


def test_p_planner_is_the_share_of_planned_sequences_and_the_rest_are_random_orders():
    model = network()
    (orders, _), drawn = planner_orders(model, ids=torch.arange(64), p_planner=0.25)
    report = drawn.cost.report(2)
    assert 0.1 < report["planned_share"] < 0.45 and report["planner_s"] > 0
    assert all(sorted(order) == list(range(N)) for order in orders.tolist())
    assert drawn.cost.report(1) == {"planner_s": 0.0, "planner_rows": 0.0, "planned_share": 0.0}


def test_the_model_is_back_in_training_mode_and_no_gradient_was_made():
    model = network()
    planner_orders(model, ids=torch.arange(1))
    assert model.training
    assert all(p.grad is None for p in model.parameters())


def test_other_kinds_ignore_the_model_and_draw_as_the_order_sampler():
    config = OrderConfig(kind="random")
    orders = TrainingOrders(config, N, 3, network())
    ids = torch.arange(5)
    expected = OrderSampler(config, N, 3)(2, ids)
    drawn = orders(2, ids, TEXTS[ids])
    assert not orders.planned and torch.equal(drawn[0], expected[0])


def test_planner_weights_ema_plans_with_the_network_it_is_given_for_the_step():
    """order.planner_weights=ema: the planner runs on planner_model(step) (the trainer's copy of
    the EMA's weights), fetched once per call whether or not the call plans, and its orders are
    those that network takes, not the trained one's."""
    trained, other = network(), network()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.3 * torch.randn_like(p))
    asked = []

    def ema_copy(step):
        asked.append(step)
        return other

    config = OrderConfig(kind="planner", p_planner=1.0, planner_weights="ema")
    orders = TrainingOrders(config, N, 3, trained, ema_copy)
    ids = torch.arange(6)
    planned, _ = orders(5, ids, TEXTS[ids])
    assert asked == [5]
    assert torch.equal(planned, planner_orders(other, step=5)[0][0])
    assert not torch.equal(planned, planner_orders(trained, step=5)[0][0])
    none = OrderConfig(kind="planner", p_planner=0.0, planner_weights="ema")
    TrainingOrders(none, N, 3, trained, ema_copy)(6, ids, TEXTS[ids])
    assert asked == [5, 6]  # a rank that plans nothing at a step still takes part in the copy
    assert "EMA weights" in config.describe()
