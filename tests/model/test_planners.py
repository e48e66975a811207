"""Planners (model/sampler/planners.py) choose the next positions by the model's own scores on the
exact cache: what they choose is what full forwards say, the order they took is recorded with its
exact likelihood, and a sample does not depend on its batch."""

import pytest
import torch
from conftest import assert_cache_holds_the_full_forward, perturbed_float64_model

from aogpt import UsageError
from aogpt.model.config import ModelConfig
from aogpt.model.sampler import KVCacheSampler, SamplingConfig
from aogpt.model.sampler.ways import WAYS

N, B = 12, 4
PLANNED = {
    "confidence": {"planner": "confidence"},
    "margin-reveal-2": {"planner": "margin", "reveal": 2},
    "entropy-budget-3": {"planner": "entropy", "candidates": 3},
    "threshold": {"planner": "threshold", "threshold": 0.5},
    "confidence-blocks": {"planner": "confidence", "block": 4},
    "margin-blocks-reveal-3": {"planner": "margin", "reveal": 3, "block": 4},
}


def model():
    config = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, cond_dim=8)
    network = perturbed_float64_model(config)
    with torch.no_grad():
        network.lm_head.weight.mul_(30.0)  # peaked distributions: the scores differ
    return network


def generate(network, settings: dict, ids=None, given=None, on_step=None):
    ids = torch.arange(B) if ids is None else ids
    sampler = KVCacheSampler(network, len(ids), N, SamplingConfig(seed=1, **settings))
    tokens, mask = (None, None) if given is None else (given[0].expand(len(ids), -1),
                                                       given[1].expand(len(ids), -1))
    return sampler.generate(ids, tokens, mask, on_step=on_step), sampler


@pytest.mark.parametrize("settings", PLANNED.values(), ids=PLANNED.keys())
def test_the_recorded_orders_exact_likelihood_is_a_teacher_forced_pass_along_it(settings):
    network = model()
    out, _ = generate(network, settings)
    forced = -network.token_nll(out.tokens, out.orders).sum(dim=1)
    torch.testing.assert_close(out.stats["log_likelihood"], forced, rtol=0, atol=1e-9)
    assert all(sorted(order) == list(range(N)) for order in out.orders.tolist())


@pytest.mark.parametrize("settings", PLANNED.values(), ids=PLANNED.keys())
def test_a_planned_sample_does_not_depend_on_its_batch(settings):
    network = model()
    batch, _ = generate(network, settings)
    for i in (0, 3):
        alone, _ = generate(network, settings, ids=torch.tensor([i]))
        assert torch.equal(alone.tokens[0], batch.tokens[i])
        assert torch.equal(alone.orders[0], batch.orders[i])


@torch.no_grad()
def remaining_scores(network, tokens, order, known: int, planner: str) -> dict[int, float]:
    """What a planner scores for each remaining position after `known` tokens of the order:
    full forwards reading the known ones, then that position."""
    result = {}
    for position in order[known:]:
        reading = order[:known] + [position] + [p for p in order[known:] if p != position]
        logits = network.logits(tokens[None], torch.tensor([reading]))[0, known]
        result[position] = float(WAYS[planner].strategy.score(logits.float().softmax(dim=-1)))
    return result


@pytest.mark.parametrize("planner", ["confidence", "margin", "entropy"])
def test_each_call_reveals_the_best_scored_remaining_position(planner):
    network = model()
    out, _ = generate(network, {"planner": planner})
    assert out.network_calls == N  # one position per call
    for b in range(2):
        tokens, order = out.tokens[b], out.orders[b].tolist()
        for known in range(N - 1):
            scored = remaining_scores(network, tokens, order, known, planner)
            assert scored[order[known]] >= max(scored.values()) - 1e-9


def test_the_threshold_planner_reveals_every_position_above_it_and_at_least_one():
    network = model()
    starts = []
    out, _ = generate(network, {"planner": "threshold", "threshold": 0.5},
                      on_step=lambda step: starts.append(step.bounds[1].tolist()))
    for b in range(B):
        tokens, order = out.tokens[b], out.orders[b].tolist()
        known = [call[b] for call in starts if call[b] < N] + [N]
        for before, after in zip(known[:-1], known[1:], strict=False):
            if before == after:
                continue
            scored = remaining_scores(network, tokens, order, before, "confidence")
            above = {p for p, s in scored.items() if s >= 0.5}
            assert set(order[before:after]) == (above or {max(scored, key=scored.get)})
    assert out.network_calls < N


def test_blocks_are_generated_left_to_right_and_planned_within():
    network = model()
    out, _ = generate(network, {"planner": "confidence", "block": 4})
    for order in out.orders.tolist():
        assert [sorted(order[i:i + 4]) for i in range(0, N, 4)] == [
            list(range(i, i + 4)) for i in range(0, N, 4)]
    assert out.orders[:, :4].tolist() != [[0, 1, 2, 3]] * B  # the planner chose within


def test_given_tokens_are_kept_and_read_first():
    network = model()
    tokens, mask = torch.zeros(N, dtype=torch.long), torch.zeros(N, dtype=torch.bool)
    tokens[[0, 1, 7]], mask[[0, 1, 7]] = torch.tensor([464, 3290, 13]), True
    out, _ = generate(network, {"planner": "margin", "reveal": 2}, given=(tokens, mask))
    assert (out.tokens[:, mask] == tokens[mask]).all()
    assert (out.orders[:, :3] == torch.tensor([0, 1, 7])).all()
    forced = -network.token_nll(out.tokens, out.orders)[:, 3:].sum(dim=1)  # the generated ones
    torch.testing.assert_close(out.stats["log_likelihood"], forced, rtol=0, atol=1e-9)


@pytest.mark.parametrize("settings", [{"planner": "confidence"}, {"planner": "threshold"},
                                      {"planner": "entropy", "reveal": 3}])
def test_after_generation_the_cache_holds_the_full_forwards_keys_and_values(settings):
    network = model()
    out, sampler = generate(network, settings)
    assert_cache_holds_the_full_forward(network, out, sampler)


def test_the_scores_rank_as_their_names_say():
    sure, torn = torch.tensor([0.9, 0.05, 0.05]), torch.tensor([0.5, 0.45, 0.05])
    scores = {planner: WAYS[planner].strategy.score for planner in ("confidence", "margin",
                                                                    "entropy", "threshold")}
    for score in scores.values():
        assert score(sure) > score(torn)
    assert scores["margin"](torn) == pytest.approx(0.05)
    assert scores["entropy"](torch.tensor([0.5, 0.5, 0.0])) == pytest.approx(-0.6931, abs=1e-4)
    assert scores["threshold"](torn) == scores["confidence"](torn) == 0.5


@pytest.mark.parametrize("settings, message", [
    ({"planner": "boldest"}, "planner='boldest' is unknown: use one of order, confidence"),
    ({"planner": "margin", "reveal": 0}, "reveal must be >= 1"),
    ({"planner": "threshold", "threshold": 1.0},
     "threshold must be in (0, 1) (a top probability), got 1.0"),
    ({"planner": "threshold", "threshold": 0.0},
     "threshold must be in (0, 1) (a top probability), got 0.0"),
    ({"planner": "margin", "candidates": 0}, "candidates must be >= 1 (unset: all), got 0"),
    ({"planner": "margin", "block": 0}, "block must be >= 1 (unset: one block), got 0"),
    ({"planner": "margin", "sampler": "speculative"}, "needs sampler='parallel'"),
])
def test_bad_planner_settings_are_usage_errors(settings, message):
    with pytest.raises(UsageError) as err:
        KVCacheSampler(model(), B, N, SamplingConfig(**settings))
    assert message in str(err.value)


@pytest.mark.parametrize("settings", PLANNED.values(), ids=PLANNED.keys())
def test_a_text_scored_along_a_planners_order_is_its_exact_likelihood_there(settings):
    """Teacher forcing (forced_tokens): the planner reveals the text's own tokens, and the
    log-likelihood recorded is a teacher-forced pass along the order it took."""
    network = model()
    text = torch.randint(0, 50, (B, N))
    sampler = KVCacheSampler(network, B, N, SamplingConfig(seed=1, **settings))
    out = sampler.generate(torch.arange(B), forced_tokens=text)
    assert torch.equal(out.tokens, text)
    forced = -network.token_nll(text, out.orders).sum(dim=1)
    torch.testing.assert_close(out.stats["log_likelihood"], forced, rtol=0, atol=1e-9)


@pytest.mark.parametrize("settings", [{"planner": "margin"},
                                      {"planner": "entropy", "candidates": 3},
                                      {"planner": "threshold", "threshold": 0.7}],
                         ids=["margin", "entropy-budget-3", "threshold"])
def test_the_planners_likelihood_sums_to_one_over_every_text(settings):
    """A likelihood, not a bound: the order depends on the revealed tokens only, so each text
    has one path and the probabilities of all texts of a tiny vocabulary add up to one."""
    vocab, n = 3, 4
    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=n, cond_dim=8,
                         vocab_size=vocab)
    network = perturbed_float64_model(config)
    with torch.no_grad():
        network.lm_head.weight.mul_(10.0)  # scores that move with the tokens revealed
    texts = torch.cartesian_prod(*[torch.arange(vocab)] * n)  # (81, 4): every text
    sampler = KVCacheSampler(network, len(texts), n, SamplingConfig(seed=1, **settings))
    out = sampler.generate(torch.zeros(len(texts), dtype=torch.long), forced_tokens=texts)
    assert out.stats["log_likelihood"].exp().sum().item() == pytest.approx(1.0, abs=1e-12)
    assert len({tuple(order) for order in out.orders.tolist()}) > 1  # the order does depend on x


def test_forced_tokens_need_a_planner():
    sampler = KVCacheSampler(model(), B, N, SamplingConfig(seed=1))
    with pytest.raises(UsageError, match="forced tokens score a text along a planner's order"):
        sampler.generate(torch.arange(B), forced_tokens=torch.zeros(B, N, dtype=torch.long))
