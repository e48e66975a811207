"""order.weighting: uniform leaves the loss exactly as it was (no weights at all, and weights of
ones through the weighted path give the same bits), bell weighs the k-th prediction of an order by
a Gaussian in the share of the sequence it sees, and the chunked loss differentiates a weighted
mean as autograd does."""

import pytest
import torch

from aogpt.model import AOGPT, ModelConfig
from aogpt.model.loss import linear_cross_entropy
from aogpt.model.orders import WEIGHTINGS, OrderConfig, prediction_weights

VOCAB, D = 300, 24


def head_inputs(n: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, D, generator=g, requires_grad=True)
    weight = (torch.randn(VOCAB, D, generator=g) * 0.3).requires_grad_()
    bias = torch.randn(VOCAB, generator=g).requires_grad_()
    targets = torch.randint(0, VOCAB, (n,), generator=g)
    return hidden, weight, bias, targets


def loss_and_grads(token_weights=None, chunk_size=16, per_token=None, seed=0):
    hidden, weight, bias, targets = head_inputs(seed=seed)
    nll, mean = linear_cross_entropy(hidden, weight, bias, targets, chunk_size, return_mean=True,
                                     token_weights=token_weights)
    (mean if per_token is None else mean + (nll * per_token).sum()).backward()
    return nll, mean, hidden.grad, weight.grad, bias.grad


@pytest.mark.parametrize("word", WEIGHTINGS)
def test_every_weighting_is_none_or_weights_of_mean_one(word):
    weights = prediction_weights(OrderConfig(weighting=word), 36)
    assert weights is None or (weights.shape == (36,) and abs(float(weights.mean()) - 1) < 1e-6)


def test_uniform_weighting_makes_no_weights():
    assert prediction_weights(OrderConfig(), 36) is None
    assert prediction_weights(OrderConfig(weighting="uniform"), 1024) is None


@pytest.mark.parametrize("chunk_size", [16, 0], ids=["chunked", "all-logits"])
def test_weights_of_ones_give_the_unweighted_loss_and_gradients_bit_for_bit(chunk_size):
    plain = loss_and_grads(chunk_size=chunk_size)
    ones = loss_and_grads(torch.ones(40), chunk_size=chunk_size)
    for a, b in zip(plain, ones, strict=True):
        assert torch.equal(a, b)


def test_bell_weights_peak_at_half_the_sequence_seen_and_are_symmetric():
    weights = prediction_weights(OrderConfig(weighting="bell", bell_width=0.25), 36)
    assert torch.allclose(weights, weights.flip(0))
    assert int(weights.argmax()) in (17, 18)
    # exp(-(u - 1/2)^2 / (2 * 0.25^2)) / mean at u = 0.5/36 and 17.5/36 (docs/orders.md's table)
    assert float(weights[0]) == pytest.approx(0.2524, abs=1e-3)
    assert float(weights[17]) == pytest.approx(1.6691, abs=1e-3)
    wider = prediction_weights(OrderConfig(weighting="bell", bell_width=1.0), 36)
    assert float(wider.max() / wider.min()) < float(weights.max() / weights.min())


@pytest.mark.parametrize("per_token", [False, True], ids=["mean", "mean-and-per-token"])
def test_the_chunked_weighted_mean_differentiates_as_autograd_does(per_token):
    token_weights = torch.rand(40, generator=torch.Generator().manual_seed(1)) * 2
    extra = torch.randn(40, generator=torch.Generator().manual_seed(2)) if per_token else None
    chunked = loss_and_grads(token_weights, chunk_size=16, per_token=extra)
    reference = loss_and_grads(token_weights, chunk_size=0, per_token=extra)  # plain autograd
    for ours, theirs in zip(chunked, reference, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_the_models_weighted_mean_weighs_predictions_by_their_place_in_the_order():
    torch.manual_seed(0)
    model = AOGPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=12, cond_dim=8,
                              vocab_size=20))
    idx = torch.randint(0, 20, (3, 12))
    orders = torch.stack([torch.randperm(12) for _ in range(3)])
    weights = prediction_weights(OrderConfig(weighting="bell"), 12)
    nll, mean = model(idx, orders, return_mean=True, weights=weights)
    plain, _ = model(idx, orders, return_mean=True)
    assert torch.equal(nll, plain)  # the per-token nll stays unweighted
    torch.testing.assert_close(mean, (plain * weights).mean())
