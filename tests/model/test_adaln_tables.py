"""AdaLN modulations from per-position tables (AOGPT.adaln_tables) are the per-token projections
the paper computes, in value and in gradient: a slot's modulations depend on its target position
only, so projecting each position once and gathering rows is the same arithmetic."""

import torch
from conftest import perturbed_float64_model

from aogpt.model import AOGPT
from aogpt.model.config import ModelConfig

T, B = 12, 3


def model_with_block(block_size: int) -> AOGPT:
    return perturbed_float64_model(ModelConfig(n_layer=2, n_head=2, n_embd=32,
                                               block_size=block_size, cond_dim=8))


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 50257, (B, T), generator=g)
    orders = torch.stack([torch.randperm(T, generator=g) for _ in range(B)])
    return idx, orders


def per_token_projection(model: AOGPT):
    """The paper's computation: every slot's code through each block's projection, as a table
    with one row per slot (the adaln_tables form for calls with fewer slots than positions)."""
    def tables(target_positions):
        codes = model.transformer.wtpe(target_positions).flatten(0, -2)
        rows = torch.arange(len(codes)).view_as(target_positions)
        blocks = [block.adaLN(codes) for block in model.transformer.h]
        return blocks + [model.transformer.final_layer.adaLN_final(codes)], rows
    return tables


def loss_and_gradients(model: AOGPT, idx, orders):
    model.zero_grad(set_to_none=True)
    _, loss = model(idx, orders, return_mean=True)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_a_training_batch_gathers_from_tables_of_every_position():
    model = model_with_block(16)  # 3 x 12 slots outnumber the 16 positions
    tables, rows = model.adaln_tables(torch.zeros(B, T, dtype=torch.long))
    assert [tuple(t.shape) for t in tables] == [(16, 6 * 32)] * 2 + [(16, 2 * 32)]
    assert rows.shape == (B, T)
    short, short_rows = model.adaln_tables(torch.tensor([[3, 5]]))  # a short prompt: its own rows
    assert short[0].shape == (2, 6 * 32) and short_rows.tolist() == [[0, 1]]


def test_tables_give_the_per_token_losses_and_gradients_of_every_parameter():
    """float64: the two orders of summation (per position, then over the projection's rows;
    or per token) agree to ~1e-15 relative; a wrong row, a missed gradient path or a double
    count would be O(1)."""
    model = model_with_block(16)
    idx, orders = batch()
    loss, grads = loss_and_gradients(model, idx, orders)
    model.adaln_tables = per_token_projection(model)
    reference_loss, reference = loss_and_gradients(model, idx, orders)
    assert torch.allclose(loss, reference_loss, rtol=1e-12, atol=0)
    assert grads.keys() == reference.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference[name], rtol=1e-10, atol=1e-12, msg=name)
    assert reference["transformer.wtpe.weight"].abs().sum() > 0  # the path under test is live


def test_fp32_tables_stay_within_rounding_of_the_per_token_projection():
    """fp32: the weight gradient of a projection sums 36 tokens' outer products either per token
    or per position first: both are sums of the same 36 terms, off by at most ~36 u relative
    (u = 6e-8), i.e. ~2e-6; 1e-4 leaves room for the backward pass's other sums."""
    model = model_with_block(16).float()
    idx, orders = batch(1)
    _, grads = loss_and_gradients(model, idx, orders)
    model.adaln_tables = per_token_projection(model)
    _, reference = loss_and_gradients(model, idx, orders)
    for name, grad in grads.items():
        scale = reference[name].abs().max().clamp(min=1e-30)
        assert (grad - reference[name]).abs().max() <= 1e-4 * scale, name
