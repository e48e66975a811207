"""Training arithmetic on a GPU: bf16 autocast and the compiled path compute the loss and the
gradients of a float64 reference to bf16's precision.

bf16 keeps 8 significant bits (unit roundoff 2^-9 ~ 0.002). A 2-layer model's loss goes through
a few dozen roundings that partly cancel, so a relative error below 1% (5 roundoffs) for the loss
and 5% for the gradient norm of each tensor is what bf16 matmuls allow, while any real bug (a
wrong order, a missing scale) moves them by O(1)."""

import copy

import pytest
import torch

from aogpt.model import AOGPT
from aogpt.model.config import tiny

pytestmark = pytest.mark.gpu


def batch(model, b=4):
    g = torch.Generator().manual_seed(0)
    t = model.config.block_size
    idx = torch.randint(0, 50257, (b, t), generator=g)
    orders = torch.stack([torch.randperm(t, generator=g) for _ in range(b)])
    return idx.cuda(), orders.cuda()


def loss_and_grads(model, idx, orders, autocast: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
        _, loss = model(idx, orders, return_mean=True)
    loss.backward()
    return loss.double(), {n: p.grad.double() for n, p in model.named_parameters()}


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(0)
    model = AOGPT(tiny()).cuda()
    idx, orders = batch(model)
    loss, grads = loss_and_grads(copy.deepcopy(model).double(), idx, orders, autocast=False)
    return model, idx, orders, loss, grads


@pytest.mark.parametrize("compiled", [False, True])
def test_autocast_bf16_follows_the_float64_loss_and_gradients(reference, compiled):
    model, idx, orders, ref_loss, ref_grads = reference
    model = copy.deepcopy(model)
    if compiled:
        model.compile_for_training()
    loss, grads = loss_and_grads(model, idx, orders, autocast=True)
    assert relative(loss, ref_loss) < 1e-2
    for name, grad in grads.items():
        assert relative(grad, ref_grads[name]) < 5e-2, name


def test_the_compiled_step_does_not_recompile_after_the_first(reference):
    model, idx, orders, _, _ = reference
    model = copy.deepcopy(model)
    model.compile_for_training()
    from torch._dynamo.utils import counters

    loss_and_grads(model, idx, orders, autocast=True)
    graphs = counters["stats"]["unique_graphs"]
    for _ in range(3):
        loss_and_grads(model, idx, orders.flip(1), autocast=True)
    assert counters["stats"]["unique_graphs"] == graphs
