"""Parameter counts, initialization, optimizer groups and FLOPs are the paper's."""

import math

import pytest
import torch

from aogpt import UsageError
from aogpt.model import AOGPT
from aogpt.model.config import ModelConfig, medium, sigma_gpt, small


def on_meta(config: ModelConfig) -> AOGPT:
    with torch.device("meta"):  # shapes only: instant even for the medium model
        return AOGPT(config)


@pytest.mark.parametrize("make, millions", [
    (small, 170.61), (medium, 425.80),
    (lambda: sigma_gpt(small()), 125.16), (lambda: sigma_gpt(medium()), 355.65),
])
def test_parameter_counts_match_the_paper(make, millions):
    assert round(on_meta(make()).num_params() / 1e6, 2) == millions


def test_small_parameter_breakdown_matches_the_paper():
    model = on_meta(small())
    assert model.num_params() == 170_605_952
    assert round((model.num_params() - model.transformer.wpe.weight.numel()) / 1e6, 2) == 169.82
    head = sum(p.numel() for p in model.lm_head.parameters())
    adaln = sum(p.numel() for n, p in model.named_parameters() if "adaLN" in n)
    assert (round(head / 1e6, 2), round(adaln / 1e6, 2)) == (38.68, 7.33)


def test_parameter_order_is_the_papers():
    names = [n for n, _ in on_meta(small()).named_parameters()]
    assert names[:4] == ["transformer.wte.weight", "transformer.wpe.weight",
                         "transformer.wtpe.weight", "transformer.wnonee.weight"]
    assert names[-2:] == ["lm_head.weight", "lm_head.bias"]


@pytest.fixture(scope="module")
def initialized() -> AOGPT:
    torch.manual_seed(0)
    return AOGPT(ModelConfig(n_layer=4, n_head=4, n_embd=128, block_size=256, cond_dim=128))


def test_init_is_truncated_normal_at_three_std(initialized):
    for name, p in initialized.named_parameters():
        if p.dim() < 2 or "c_proj" in name:
            continue
        assert p.abs().max() <= 0.06 + 1e-6, name
        if p.numel() >= 10_000:  # a normal cut at 3 std has std 0.9866 x 0.02
            assert abs(p.std().item() - 0.9866 * 0.02) < 0.0006, name


def test_residual_projections_are_scaled_by_depth(initialized):
    std = 0.02 / math.sqrt(2 * 4)
    for name, p in initialized.named_parameters():
        if name.endswith("c_proj.weight"):
            assert p.abs().max() <= 3 * std + 1e-6, name
            assert abs(p.std().item() - 0.9866 * std) < 0.1 * std, name


def test_biases_start_at_zero_and_norms_at_one(initialized):
    for name, p in initialized.named_parameters():
        if name.endswith("bias"):
            assert torch.all(p == 0), name
        elif p.dim() == 1:
            assert torch.all(p == 1), name
    gates = initialized.transformer.h[0].adaLN[1].weight
    assert gates.abs().max() > 0  # AO-GPT does not zero-init AdaLN (unlike SEDD's adaLN-Zero)


def test_sigma_gpt_init_is_plain_normal_with_a_tied_head():
    torch.manual_seed(0)
    model = AOGPT(sigma_gpt(ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=64)))
    assert model.lm_head.weight is model.transformer.wte.weight and model.lm_head.bias is None
    assert model.transformer.wte.weight.abs().max() > 0.07  # 3.2M normal draws pass 3.5 std


def test_adaln_zero_init_zeroes_every_modulation():
    model = AOGPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, cond_dim=8,
                              adaln_zero_init=True))
    adaln = [p for n, p in model.named_parameters() if "adaLN" in n]
    assert len(adaln) == 6 and all(torch.all(p == 0) for p in adaln)


def test_param_groups_decay_matrices_and_embeddings_only():
    model = on_meta(small())
    decay, no_decay = model.param_groups(0.03)
    assert decay["weight_decay"] == 0.03 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() < 2 for p in no_decay["params"])
    assert any(p is model.transformer.wtpe.weight for p in decay["params"])
    every = decay["params"] + no_decay["params"]
    assert len({id(p) for p in every}) == len(every) == len(list(model.parameters()))


def test_flops_per_token_counts_matmul_parameters_and_attention():
    model = on_meta(small())
    tables = sum(model.transformer[name].weight.numel()
                 for name in ("wte", "wpe", "wtpe", "wnonee"))
    n = 170_605_952 - tables
    assert model.flops_per_token(1024) == 6 * n + 12 * 12 * 768 * 1024
    tied = on_meta(sigma_gpt(small()))  # the tied wte is the head's matmul: it counts
    assert tied.flops_per_token(1024) == (6 * (125_161_728 - 787_200 - 786_432 - 768)
                                          + 12 * 12 * 768 * 1024)
    # Megatron's and MaxText's count: a causal kernel computes half the scores
    assert model.flops_per_token(1024, causal=True) == 6 * n + 6 * 12 * 768 * 1024


@pytest.mark.parametrize("change, message", [
    (dict(norm="batch"), "model.norm='batch' is unknown"),
    (dict(target_injection="concat"), "model.target_injection='concat' is unknown"),
    (dict(attn_impl="xformers"), "model.attn_impl='xformers' is unknown"),
    (dict(n_embd=30), "divisible"),
])
def test_unknown_variants_and_bad_shapes_are_usage_errors(change, message):
    with pytest.raises(UsageError, match=message):
        AOGPT(ModelConfig(**{**dict(n_layer=1, n_head=4, n_embd=32, block_size=8), **change}))
