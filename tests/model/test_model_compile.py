"""torch.compile (inductor, which runs on CPU too): the compiled blocks and loss train exactly
like the eager model, and shapes stay static, so nothing recompiles after the first step."""

import copy
import re

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code
from vocabulary_testing import drawn_afresh, order_configs

from aogpt.model import AOGPT, ModelConfig
from aogpt.model.orders import OrderConfig, OrderSampler

pytestmark = pytest.mark.slow  # inductor compiles C++ for the CPU: ~30-60 s on 2 cores
T, B, STEPS = 32, 4, 4


def train(model: AOGPT, steps: int, after_first_step=lambda: None) -> list[float]:
    """AdamW steps on fixed random tokens in mixture orders; the loss before each step."""
    optimizer = torch.optim.AdamW(model.param_groups(0.1), lr=1e-3)
    sampler = OrderSampler(OrderConfig(kind="mixture", p_left_to_right=0.5), T, seed=0)
    idx = torch.randint(0, 50257, (B, T), generator=torch.Generator().manual_seed(1))
    losses = []
    for step in range(steps):
        orders, _ = sampler(step, torch.arange(B))
        _, loss = model(idx, orders, return_mean=True)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step == 0:
            after_first_step()
    return losses


@pytest.mark.parametrize("scope", ["block", "network"])
def test_compiled_training_matches_eager_and_compiles_once_without_graph_breaks(scope):
    torch.manual_seed(0)
    config = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=T, cond_dim=8,
                         loss_chunk_size=64, activation_checkpointing=True)
    eager = AOGPT(config).train()
    compiled = copy.deepcopy(eager)
    compiled.compile_for_training(scope)

    counters.clear()
    graphs = []
    losses = train(compiled, STEPS, lambda: graphs.append(counters["stats"]["unique_graphs"]))
    assert graphs[0] > 0  # it did compile
    assert counters["stats"]["unique_graphs"] == graphs[0]  # and never again after step 1
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])

    # fp32 throughout: fused kernels sum in another order (a few ulps, ~1e-6 on losses ~11);
    # AdamW's normalized steps carry that into the weights at ~lr x 1e-6 / |grad| for the
    # smallest gradients, so after 4 steps the losses agree to ~1e-5, while a real difference
    # (a missed scale, another order) moves them by >1e-2.
    assert losses == pytest.approx(train(eager, STEPS), abs=1e-4)


# every order configuration that draws through the compiled draw (one order for all samples is
# drawn once, eagerly)
COMPILED_ORDERS = {name: config for name, config in order_configs(8).items()
                   if drawn_afresh(config)}


@pytest.mark.parametrize("config", COMPILED_ORDERS.values(), ids=list(COMPILED_ORDERS))
def test_compiled_orders_are_the_eager_bits_and_a_new_step_never_recompiles(config):
    eager, compiled = OrderSampler(config, T, seed=7), OrderSampler(config, T, seed=7)
    compiled.compile()
    torch._dynamo.reset()  # another test's graph of the same function could serve this one
    counters.clear()
    for step in range(6):
        indices = torch.arange(step * B, (step + 1) * B)
        if step == 0:
            drawn, kernels = run_and_get_code(compiled, step, indices)
            assert not wide_index_arithmetic(kernels)
        else:
            drawn = compiled(step, indices)
        for ours, theirs in zip(drawn, eager(step, indices), strict=True):
            assert torch.equal(ours, theirs)
        if step == 0:
            graphs = counters["stats"]["unique_graphs"]
    assert counters["stats"]["unique_graphs"] == graphs == 1


def wide_index_arithmetic(kernels: list[str]) -> list[str]:
    """The lines of Inductor's kernels that put a constant outside int32 into index arithmetic
    (the loop variables x0, x1, ... or a vectorised arange). On a GPU, Triton computes index
    arithmetic in int32 and refuses to compile such a kernel: this is how the hash's golden-ratio
    multiplier, folded into (arange + 1) * golden, broke every compiled training step on an
    H200 while the CPU's C++ kernels (64-bit indices) ran it. Constants as values are fine."""
    wide = [line.strip() for code in kernels for line in code.splitlines()
            if re.search(r"\bx\d+\b|arange\(", line) and "static_cast" not in line
            and any(abs(int(v)) >= 2**31 for v in re.findall(r"-?\b\d{10,}", line))]
    return wide
