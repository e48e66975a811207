"""The forward pass computes what the paper's model computes, for any order, and the loss is its
mean."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import perturbed_float64_model
from vocabulary_testing import ANY_ORDER_VARIANTS, variant_config

from aogpt import UsageError
from aogpt.model import AOGPT, loss, shuffle, unshuffle
from aogpt.model.config import PADDED_VOCAB, ModelConfig, plain_gpt, sigma_gpt

T = 12  # tokens per test sequence


def tiny_config(**changes) -> ModelConfig:
    return ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, cond_dim=8, **changes)


def make_model(config: ModelConfig | None = None, seed: int = 0) -> AOGPT:
    return perturbed_float64_model(config or tiny_config(), seed)


def random_batch(b: int = 3, t: int = T, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 50257, (b, t), generator=g)
    orders = torch.stack([torch.randperm(t, generator=g) for _ in range(b)])
    return idx, orders


def reference_logits(model: AOGPT, idx: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
    """The model's slot table (model/gpt.py) computed plainly from the weights, with the paper's
    t+1 slots: slot 0 = [None], slot k = x[sigma_{k-1}] at wpe[sigma_{k-1}+1], condition
    wtpe[sigma_k], the last slot conditioned on zeros. Returns the logits of slots 0..t-1,
    (b, t, vocab)."""
    w = model.state_dict()
    n_layer, n_head = model.config.n_layer, model.config.n_head
    b, t = idx.shape

    def rms(x, weight):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight

    def linear(x, name):
        return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    rows, conds = [], []
    for i in range(b):
        sigma = orders[i].tolist()
        slot_inputs = [w["transformer.wnonee.weight"][0] + w["transformer.wpe.weight"][0]]
        slot_inputs += [w["transformer.wte.weight"][idx[i, p]] + w["transformer.wpe.weight"][p + 1]
                        for p in sigma]
        rows.append(torch.stack(slot_inputs))
        cond = [w["transformer.wtpe.weight"][p] for p in sigma]
        conds.append(torch.stack(cond + [torch.zeros_like(cond[0])]))
    x, c = torch.stack(rows), F.silu(torch.stack(conds))  # (b, t+1, d), (b, t+1, cond_dim)
    causal = torch.ones(t + 1, t + 1, dtype=torch.bool).tril()
    for layer in range(n_layer):
        p = f"transformer.h.{layer}"
        shift1, scale1, gate1, shift2, scale2, gate2 = linear(c, f"{p}.adaLN.1").chunk(6, -1)
        h = rms(x, w[f"{p}.ln_1.weight"]) * (1 + scale1) + shift1
        q, k, v = linear(h, f"{p}.attn.c_attn").split(x.size(-1), -1)
        q, k, v = (z.view(b, t + 1, n_head, -1).transpose(1, 2) for z in (q, k, v))
        q, k = rms(q, w[f"{p}.attn.q_norm.weight"]), rms(k, w[f"{p}.attn.k_norm.weight"])
        scores = (q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))).masked_fill(~causal, -math.inf)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(x.shape)
        x = x + gate1 * linear(y, f"{p}.attn.c_proj")
        h = rms(x, w[f"{p}.ln_2.weight"]) * (1 + scale2) + shift2
        x = x + gate2 * linear(F.gelu(linear(h, f"{p}.mlp.c_fc")), f"{p}.mlp.c_proj")
    shift, scale = linear(c, "transformer.final_layer.adaLN_final.1").chunk(2, -1)
    x = rms(x, w["transformer.final_layer.ln_f.weight"]) * (1 + scale) + shift
    return linear(x, "lm_head")[:, :t]


def test_shuffle_and_unshuffle_are_inverses():
    idx, orders = random_batch()
    assert torch.equal(unshuffle(shuffle(idx, orders), orders), idx)
    assert torch.equal(shuffle(unshuffle(idx, orders), orders), idx)
    values = torch.randn(*idx.shape, 5)  # (b, t, ...) values move along with their position
    assert torch.equal(unshuffle(shuffle(values, orders), orders), values)
    assert torch.equal(shuffle(idx, orders)[1, 4], idx[1, orders[1, 4]])


def test_identity_order_is_a_causal_lm_over_none_then_x():
    model = make_model()
    idx, _ = random_batch()
    identity = torch.arange(T).expand(3, T)
    expected = reference_logits(model, idx, identity)
    torch.testing.assert_close(model.logits(idx, identity), expected, rtol=1e-9, atol=1e-9)
    # None = left to right
    torch.testing.assert_close(model.logits(idx), model.logits(idx, identity))


def test_any_order_matches_the_papers_stream_with_its_zero_condition_last_slot():
    model = make_model()
    idx, orders = random_batch()
    expected = reference_logits(model, idx, orders)
    torch.testing.assert_close(model.logits(idx, orders), expected, rtol=1e-9, atol=1e-9)


def test_slot_k_is_conditioned_on_the_kth_target_and_predicts_it():
    model = make_model()
    idx, orders = random_batch(b=1)
    k = 5
    logits = model.logits(idx, orders)
    nll = model(idx, orders)
    target = idx[0, orders[0, k]]
    assert torch.allclose(nll[0, k], F.cross_entropy(logits[0, k], target))
    # a new code for the k-th target's position reaches slots k and later only
    with torch.no_grad():
        model.transformer.wtpe.weight[orders[0, k]] += 1.0
    changed = model.logits(idx, orders)
    torch.testing.assert_close(changed[:, :k], logits[:, :k], rtol=0, atol=0)
    assert not torch.allclose(changed[:, k], logits[:, k])


def test_changing_a_later_token_never_changes_earlier_predictions():
    model = make_model()
    idx, orders = random_batch(b=1)
    logits = model.logits(idx, orders)
    for j in range(T - 1):
        edited = idx.clone()
        edited[0, orders[0, j]] = (edited[0, orders[0, j]] + 1) % 50257
        after = model.logits(edited, orders)
        # the j-th token of the order is read by slot j+1: slots 0..j cannot see it
        torch.testing.assert_close(after[:, : j + 1], logits[:, : j + 1], rtol=0, atol=0)
        assert not torch.allclose(after[:, j + 1], logits[:, j + 1])


def test_per_token_nll_is_cross_entropy_of_the_logits_and_its_mean_the_loss():
    model = make_model()
    idx, orders = random_batch()
    nll = model(idx, orders)
    targets = shuffle(idx, orders)
    full = F.cross_entropy(model.logits(idx, orders).flatten(0, 1), targets.flatten(),
                           reduction="none")
    assert nll.shape == idx.shape
    torch.testing.assert_close(nll.flatten(), full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(nll.mean(), F.cross_entropy(model.logits(idx, orders).flatten(0, 1),
                                                           targets.flatten()))
    torch.testing.assert_close(model.token_nll(idx, orders), nll)
    same_nll, hidden = model.nll_and_hidden(idx, orders)  # what a scorer reads more of
    assert torch.equal(same_nll, nll)
    torch.testing.assert_close(model.lm_head(hidden), model.logits(idx, orders), rtol=0, atol=0)


def test_unshuffled_nll_puts_each_value_at_its_tokens_original_position():
    model = make_model()
    idx, orders = random_batch()
    nll = model(idx, orders)
    by_position = unshuffle(nll, orders)
    b, k = 2, 7
    assert by_position[b, orders[b, k]] == nll[b, k]
    torch.testing.assert_close(by_position.sum(1), nll.sum(1))  # -log p(x | order) either way


@pytest.mark.parametrize("variant", ANY_ORDER_VARIANTS)
@pytest.mark.parametrize("weighting", ["mean", "weighted"])
def test_chunked_loss_equals_full_logits_loss_in_value_and_gradient(variant, weighting):
    config = variant_config(tiny_config(), variant)
    idx, orders = random_batch()
    weights = torch.rand(idx.shape, dtype=torch.float64) if weighting == "weighted" else None
    results = {}
    for chunk in (0, 7):  # 7 does not divide 3 x 12 tokens: a ragged last chunk
        model = make_model(config)
        model.config.loss_chunk_size = chunk
        nll = model(idx, orders)
        (nll.mean() if weights is None else (nll * weights).sum()).backward()
        results[chunk] = nll.detach(), {n: p.grad for n, p in model.named_parameters()}
    torch.testing.assert_close(results[7][0], results[0][0], rtol=1e-12, atol=1e-12)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[7][1][name], grad, rtol=1e-9, atol=1e-12, msg=name)


def test_chunked_loss_under_bf16_autocast_stays_close_to_full_logits():
    idx, orders = random_batch()
    results = {}
    for chunk in (0, 5):
        torch.manual_seed(0)
        model = AOGPT(tiny_config(loss_chunk_size=chunk))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            nll = model(idx, orders)
        nll.mean().backward()
        results[chunk] = nll.detach(), model.lm_head.weight.grad, model.transformer.wte.weight.grad
    assert results[5][0].dtype == torch.float32
    # bf16 keeps 8 bits (unit 2^-8); both paths share the trunk's bits and differ only in how
    # the head's matmuls are split. A logit may round to the neighbouring bf16 value (|z| 2^-8)
    # and the log-softmax is fp32, so an NLL moves by at most 2 max|z| 2^-8 (measured 4e-6,
    # against a bound of 5e-3); a ragged chunk scored against shifted targets moves by ~|z|.
    with torch.no_grad():
        logit_size = model.logits(idx, orders).abs().max()
    assert (results[5][0] - results[0][0]).abs().max() <= 2 * 2**-8 * logit_size
    # The chunks' weight gradients are bf16 matmuls each rounded (2^-9) before their fp32 sum,
    # the full one is rounded once: ~2^-8 of a row's size (measured 0.9 x 2^-8 for lm_head,
    # 1.2 x 2^-8 for wte through grad_h); a chunk's gradient dropped or doubled is O(1).
    for chunked, full in zip(results[5][1:], results[0][1:], strict=True):
        assert (chunked - full).abs().max() <= 5 * 2**-8 * full.abs().max()


def test_on_a_cpu_the_loss_runs_in_chunks_that_fit_half_the_last_level_cache(monkeypatch):
    vocab = PADDED_VOCAB
    fitted = loss.cache_fitted_chunk(vocab)
    half_cache = loss._last_level_cache_bytes() // 2
    assert fitted == 16 or fitted * vocab * 4 <= half_cache < (fitted + 1) * vocab * 4
    seen = []

    def recording(logits, *args):
        seen.append(len(logits))
        return loss.chunk_math(logits, *args)

    monkeypatch.setattr(loss, "_chunk_math", recording)
    hidden = torch.randn(2 * fitted + 5, 8, requires_grad=True)
    weight = torch.randn(vocab, 8) * 0.1
    targets = torch.randint(0, vocab, (len(hidden),))
    nll, mean = loss.linear_cross_entropy(hidden, weight, None, targets, 4096, return_mean=True)
    assert seen == [fitted, fitted, 5]  # a config's 4,096 is capped; the ragged rest stays
    mean.backward()
    reference = F.cross_entropy(hidden.detach().double() @ weight.double().t(), targets,
                                reduction="none")
    # fp32 logits of 8 products (|z| < 4) and an fp32 log-sum-exp over 50K terms: ~1e-5 nats at most
    torch.testing.assert_close(nll.double(), reference, rtol=0, atol=2e-5)


def test_inference_without_grad_uses_the_chunked_loss_too():
    model = make_model(tiny_config(loss_chunk_size=5))
    idx, orders = random_batch()
    with torch.no_grad():
        nll = model(idx, orders)
    assert not nll.requires_grad
    torch.testing.assert_close(nll, model(idx, orders).detach())


def test_activation_checkpointing_gives_the_same_gradients():
    idx, orders = random_batch()
    grads = []
    for recompute in (False, True):
        model = make_model(tiny_config(activation_checkpointing=recompute)).train()
        model(idx, orders).mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for plain, checkpointed in zip(*grads, strict=True):
        torch.testing.assert_close(checkpointed, plain, rtol=1e-9, atol=1e-12)


def test_sigma_gpt_adds_the_target_position_at_the_input():
    model = make_model(sigma_gpt(tiny_config()))
    tokens = torch.tensor([[0, 11, 12]])
    positions = torch.tensor([[-1, 4, 2]])
    targets = torch.tensor([[4, 2, 9]])
    x = model.embed(tokens, positions, targets)
    t = model.transformer
    expected = torch.stack([t.wnonee.weight[0] + t.wpe.weight[0] + t.wtpe.weight[4],
                            t.wte.weight[11] + t.wpe.weight[5] + t.wtpe.weight[2],
                            t.wte.weight[12] + t.wpe.weight[3] + t.wtpe.weight[9]])
    assert model.adaln_tables()[0] == [None] * 3 and torch.equal(x[0], expected)
    assert model.lm_head.weight is t.wte.weight


def test_plain_gpt_reads_only_left_to_right():
    model = make_model(plain_gpt(tiny_config()))
    idx, orders = random_batch()
    assert "wtpe" not in model.transformer
    nll = model(idx, torch.arange(T).expand(3, T))
    torch.testing.assert_close(nll, model(idx))
    with pytest.raises(UsageError, match="identity orders"):
        model(idx, orders)


def test_sequences_longer_than_the_block_size_are_refused():
    model = make_model()
    with pytest.raises(UsageError, match="block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(UsageError, match="shape"):
        model(torch.zeros(2, 8, dtype=torch.long), torch.arange(8)[None])
