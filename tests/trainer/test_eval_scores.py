"""The scores of trainer/evaluation.py equal their definitions computed independently.

Tolerances follow from the arithmetic. The evaluator sums per-token fp32 NLLs (~10.8 here, one
fp32 ulp = 2^-20 ~ 1e-6) in float64, so references sum in float64 too. What is left is each
token's own fp32 rounding, which differs between forwards of other shapes (batch, padding) by
an ulp or two (measured: at most 1 ulp), and between CPUs; a mean of such errors stays below
~2 ulp / 10.8 ~ 2e-7 relative even if they all had the same sign, inside rel=1e-6. A real bug
(a token dropped, padded or scored against another target) moves a mean by at least the
per-token spread over the token count, ~0.1 / 96 ~ 1e-4 relative. Identities that hold exactly
(the batched ensemble, subsampling every target) are checked on a float64 copy of the model,
where nothing but float64 rounding (~1e-16) is left.
"""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from eval_testing import build_lambada, build_wikitext, read_folder, tiny_model

from aogpt.model import OrderConfig, OrderSampler
from aogpt.trainer.ensemble import (
    choose_targets,
    ensemble_member_nll,
    member_orders,
    straightforward_member_nll,
)
from aogpt.trainer.evaluation import EvalData, EvalSettings, Evaluator

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def wikitext(tmp_path_factory):
    return build_wikitext(tmp_path_factory.mktemp("eval") / "wikitext2")


@pytest.fixture(scope="module")
def model():
    return tiny_model("adaln")


@pytest.fixture(scope="module")
def model64(model):
    """The same model in float64: for identities that hold exactly, whatever the shapes."""
    return copy.deepcopy(model).double()


def evaluate(model, folder, **settings):
    settings.setdefault("max_samples", 6)
    data = EvalData(folder, model.config.block_size, settings["max_samples"])
    return Evaluator(model, EvalSettings(**settings), CPU).score_data(data)


def test_l2r_nll_equals_per_token_cross_entropy_of_full_logits(wikitext, model):
    result = evaluate(model, wikitext, orders=("l2r",), batch_size=4)  # a partial last batch
    idx = torch.from_numpy(read_folder(wikitext)["tokens"][:6].astype("int64"))
    with torch.no_grad():
        logits = model.logits(idx)  # (6, t, vocab), all at once
    # The reference sums in float64: an fp32 sum over all tokens is itself off by ~1e-6 relative,
    # differently on CPUs that add in another order (which broke this test once). What remains is
    # each token's own fp32 rounding in either computation (logits and log-softmax, a few ulps,
    # unbiased), which averages well inside rel=1e-6.
    nll = F.cross_entropy(logits.flatten(0, 1).double(), idx.flatten(), reduction="sum").item()
    assert result["l2r"]["tokens"] == idx.numel()
    assert result["l2r"]["nll"] == pytest.approx(nll / idx.numel(), rel=1e-6)
    # ppl = exp(nll): its relative error is the NLL's absolute error (10.8 x the relative one),
    # so it is checked against the evaluator's own NLL, where only float64 rounding is left.
    assert result["l2r"]["ppl"] == pytest.approx(math.exp(result["l2r"]["nll"]), rel=1e-12)


def test_random_orders_are_the_samplers_seeded_uniform_orders(wikitext, model):
    result = evaluate(model, wikitext, orders=("random",), num_orders=3, seed=7)
    idx = torch.from_numpy(read_folder(wikitext)["tokens"][:6].astype("int64"))
    sampler = OrderSampler(OrderConfig(kind="uniform"), idx.shape[1], seed=7)
    with torch.no_grad():  # means in float64, as the evaluator's (an fp32 mean of 96 tokens
        # was ~1e-6 off, a tenth of the tolerance, in an order that depends on the CPU)
        per_order = [model(idx, sampler(k, torch.arange(6))[0]).double().mean().item()
                     for k in range(3)]
    assert result["random"]["nll_per_order"] == pytest.approx(per_order, rel=1e-6)
    assert result["random"]["nll"] == pytest.approx(sum(per_order) / 3, rel=1e-6)
    # each mean is within ~2e-6 (2 ulps of 10.8), so the std (~0.02) of 3 within ~3e-6; the
    # population std instead of the sample one would be off by 4e-3
    reference_std = torch.tensor(per_order, dtype=torch.float64).std().item()
    assert result["random"]["nll_std"] == pytest.approx(reference_std, abs=1e-5)


def test_results_do_not_depend_on_the_batch_size(wikitext, model):
    # fp32, as evaluations run: another batch size packs other forwards, whose per-token fp32
    # NLLs may differ by an ulp or two (2e-7 relative at most in a mean: see the top)
    settings = {"orders": ("l2r", "random"), "num_orders": 2, "ensemble": (1, 3)}
    one = evaluate(model, wikitext, batch_size=1, **settings)
    four = evaluate(model, wikitext, batch_size=4, **settings)
    for kind in ("l2r", "random"):
        assert one[kind]["nll"] == pytest.approx(four[kind]["nll"], rel=1e-6)
    assert one["ensemble"]["by_members"]["3"]["nll"] == pytest.approx(
        four["ensemble"]["by_members"]["3"]["nll"], rel=1e-6)


def test_ensemble_of_one_member_equals_the_random_order_nll(wikitext, model):
    # exact up to float64 rounding: member 0 is the base forward itself (the same call on the
    # same batch, bit-identical) and -log mean of one p is that NLL
    result = evaluate(model, wikitext, orders=("random",), num_orders=1, ensemble=(1,))
    assert result["ensemble"]["by_members"]["1"]["nll"] == pytest.approx(result["random"]["nll"],
                                                                          rel=1e-9)
    alone = evaluate(model, wikitext, orders=(), ensemble=(1,))  # its own base forward
    assert alone["ensemble"]["by_members"]["1"]["nll"] == pytest.approx(result["random"]["nll"],
                                                                        rel=1e-9)


def test_ensemble_of_one_member_on_the_l2r_base_equals_the_l2r_nll(wikitext, model):
    result = evaluate(model, wikitext, orders=("l2r",), ensemble=(1, 2), ensemble_base="l2r")
    assert result["ensemble"]["base"] == "l2r"
    assert result["ensemble"]["by_members"]["1"]["nll"] == pytest.approx(result["l2r"]["nll"],
                                                                          rel=1e-9)
    assert result["ensemble"]["by_members"]["2"]["nll"] != result["l2r"]["nll"]


def test_member_orders_permute_only_the_context():
    base = torch.stack([torch.randperm(10, generator=torch.Generator().manual_seed(s))
                        for s in range(3)])
    samples, targets = torch.tensor([5, 6, 7]), torch.tensor([0, 4, 9])
    for member in (0, 1, 2):
        orders = member_orders(base, samples, targets, torch.full((3,), member), seed=0, length=10)
        for row, i in enumerate(targets.tolist()):
            assert sorted(orders[row, :i].tolist()) == sorted(base[row, :i].tolist())
            assert orders[row, i:].tolist() == base[row, i:].tolist()
        if member == 0:
            assert torch.equal(orders, base)
    one, two = (member_orders(base, samples, targets, torch.full((3,), m), 0, 10) for m in (1, 2))
    assert not torch.equal(one[2], two[2])  # members differ
    cut = member_orders(base, samples, targets, torch.full((3,), 1), seed=0, length=6)
    # rows whose target is within the cut (0 and 4 < 6): a prefix-only forward sees the same context
    assert torch.equal(cut[:2], one[:2, :6])


def test_batched_ensemble_equals_full_forwards_with_permuted_contexts(wikitext, model64):
    # float64: prefix-only forwards of other shapes give the same numbers up to ~1e-15 (in fp32
    # they differed by an ulp of 10.8, 1e-6, a CPU-dependent amount); another member's context
    # order moves most NLLs, by up to 0.5
    model = model64
    idx = torch.from_numpy(read_folder(wikitext)["tokens"][:3].astype("int64"))
    b, n = idx.shape
    samples = torch.tensor([10, 11, 12])
    base = OrderSampler(OrderConfig(kind="uniform"), n, seed=3)(0, samples)[0]
    lengths = torch.full((b,), n)
    unit_sample, unit_target, _ = choose_targets(3, samples, lengths, None, n)
    with torch.no_grad():
        batched, forwards, slots = ensemble_member_nll(model, idx, base, samples[unit_sample],
                                                       unit_sample, unit_target, members=4,
                                                       seed=3, slots_per_forward=2 * n)
        expected = torch.full_like(batched, math.nan)  # a unit left unchecked fails below
        for i in range(n):  # one full forward per (target, member) serves every row
            for member in (1, 2, 3):
                reference = straightforward_member_nll(model, idx, base, samples, i, member, seed=3)
                at = unit_target == i
                expected[at, member - 1] = reference[unit_sample[at]]
    torch.testing.assert_close(batched, expected, rtol=0, atol=1e-12)
    assert forwards == b * n * 3
    prefixes = 3 * b * n * (n + 1) // 2  # each member's slots up to its target
    assert prefixes <= slots <= 1.1 * prefixes  # longest first: little padding


def test_scoring_every_target_by_subsampling_equals_the_full_ensemble(wikitext, model64):
    # the same units packed in another order into forwards of other shapes: equal only up to
    # each row's rounding, so float64, where that is ~1e-16 (fp32 would rely on every CPU's
    # matmul giving a row the same bits whatever the other rows)
    model = model64
    full = evaluate(model, wikitext, orders=(), ensemble=(1, 2, 4))
    n = full["seq_len"]
    sampled = evaluate(model, wikitext, orders=(), ensemble=(1, 2, 4), ensemble_targets=n)
    for m in ("1", "2", "4"):
        assert sampled["ensemble"]["by_members"][m]["nll"] == pytest.approx(
            full["ensemble"]["by_members"][m]["nll"], rel=1e-9)
        assert sampled["ensemble"]["by_members"][m]["nll_se"] == 0.0


def test_subsampled_ensemble_estimates_the_full_one_within_its_standard_error(wikitext, model):
    full = evaluate(model, wikitext, orders=(), ensemble=(2,), max_samples=8)
    sampled = evaluate(model, wikitext, orders=(), ensemble=(2,), ensemble_targets=5, max_samples=8)
    estimate = sampled["ensemble"]["by_members"]["2"]
    assert sampled["ensemble"]["scored_targets"] == 8 * 5
    assert sampled["ensemble"]["tokens"] == full["ensemble"]["tokens"]
    assert 0 < estimate["nll_se"] < 0.5
    exact = full["ensemble"]["by_members"]["2"]["nll"]
    assert abs(estimate["nll"] - exact) < 4 * estimate["nll_se"]
    assert sampled["ensemble"]["token_forwards"] < full["ensemble"]["token_forwards"] / 2


def test_padded_per_example_samples_are_scored_on_their_real_tokens_only(tmp_path, model):
    folder = build_lambada(tmp_path / "lambada")
    columns = read_folder(folder)
    idx = torch.from_numpy(columns["tokens"].astype("int64"))
    lengths = columns["length"].tolist()
    result = evaluate(model, folder, orders=("l2r", "random"), num_orders=1, ensemble=(1, 2),
                      seed=5, max_samples=None, batch_size=4)
    sampler = OrderSampler(OrderConfig(kind="uniform"), idx.shape[1], seed=5)
    l2r = random = 0.0
    with torch.no_grad():  # sums in float64, as the evaluator's
        for i, length in enumerate(lengths):
            x = idx[i:i + 1, :length]  # the sample cut to its real tokens: no padding at all
            l2r += model(x).double().sum().item()
            order = sampler(0, torch.tensor([i]))[0][0]
            random += model(x, order[order < length][None]).double().sum().item()
    assert result["l2r"]["tokens"] == result["ensemble"]["tokens"] == sum(lengths)
    # per-token fp32 rounding of forwards of other lengths only (see the top); padding that
    # leaked into a real token's context or score would move these by far more
    assert result["l2r"]["nll"] == pytest.approx(l2r / sum(lengths), rel=1e-6)
    assert result["random"]["nll"] == pytest.approx(random / sum(lengths), rel=1e-6)
    assert result["ensemble"]["by_members"]["1"]["nll"] == pytest.approx(result["random"]["nll"])


def test_bf16_precision_is_close_to_fp32(wikitext, model):
    fp32 = evaluate(model, wikitext, orders=("l2r",))
    bf16 = evaluate(model, wikitext, orders=("l2r",), precision="bf16")
    # bf16 autocast rounds activations and logits to 8 bits (unit 2^-8), the log-softmax stays
    # fp32. A token's NLL moves by at most 2 max|logit error|, and the logits here are below 1
    # in size: within one bf16 unit of the NLL (2^-8 relative, 0.04; measured 5e-5). A
    # log-softmax summed in bf16 would stall at 256 of the 50304 terms: O(1) off.
    assert bf16["l2r"]["nll"] == pytest.approx(fp32["l2r"]["nll"], rel=2**-8)
    assert bf16["l2r"]["nll"] != fp32["l2r"]["nll"]


def test_fp32_scores_without_tf32_even_in_a_process_that_trains_with_it(wikitext, model):
    """The trainer turns TF32 on for its own matmuls; an fp32 evaluation in that process must
    not inherit it (it would be labelled fp32 and run TF32 on a GPU), and must give it back."""
    seen = []
    scored = copy.deepcopy(model)
    forward_stream = scored.forward_stream

    def recording(*args, **kwargs):
        seen.append(torch.get_float32_matmul_precision())
        return forward_stream(*args, **kwargs)

    scored.forward_stream = recording
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # what the trainer's allow_tf32 = True sets
    try:
        evaluate(scored, wikitext, max_samples=2)
        assert seen and set(seen) == {"highest"}
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
