"""The KV-cache sampler computes what the paper's sampler computes: exact
conditionals at every step, a cache that matches training, and the controls users rely on."""

import subprocess
import sys

import pytest
import torch
from conftest import perturbed_float64_model
from vocabulary_testing import ANY_ORDER_VARIANTS, variant_config

from aogpt import UsageError
from aogpt.model import AOGPT, save_consolidated
from aogpt.model.config import GPT2_VOCAB, ModelConfig, plain_gpt
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, filter_logits, inverse_cdf
from aogpt.model.sampler.cache import StaticKVCache
from aogpt.model.sampler.parallel import reveal_counts

N = 12  # tokens per generated sequence (the model's block is 16: shorter than the block works)
B = 3


def tiny_config(**changes) -> ModelConfig:
    return ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, cond_dim=8, **changes)


def make_model(config: ModelConfig | None = None, seed: int = 0) -> AOGPT:
    return perturbed_float64_model(config or tiny_config(), seed)


def generate(model, steps=N, b=B, n=N, ids=None, on_step=None, given=None, **settings):
    config = SamplingConfig(steps=steps, **settings)
    sampler = KVCacheSampler(model, batch_size=b, seq_len=n, config=config)
    ids = torch.arange(b) if ids is None else ids
    tokens, mask = given if given is not None else (None, None)
    return sampler.generate(ids, tokens, mask, on_step=on_step), sampler


def record_steps(keep_cache_of=None):
    """An on_step callback that keeps copies of each call's outputs (and the cache)."""
    calls = []

    def on_step(out):
        entry = {"logits": out.logits.clone(), "slots": out.target_slots.clone(),
                 "valid": out.valid.clone(), "bounds": out.bounds.clone()}
        if keep_cache_of is not None:
            entry["kv"] = keep_cache_of[0].cache.kv.clone()
        calls.append(entry)

    return calls, on_step


class RecordingCache:
    """Keeps each layer's keys and values of a full causal forward."""

    def __init__(self):
        self.kv = {}

    def update(self, layer, k, v):
        self.kv[layer] = (k, v)
        return k, v


@pytest.mark.parametrize("variant", ANY_ORDER_VARIANTS)
def test_one_token_per_step_gives_the_full_forwards_logits_at_every_step(variant):
    model = make_model(variant_config(tiny_config(), variant))
    calls, on_step = record_steps()
    out, _ = generate(model, steps=N, on_step=on_step)
    assert out.network_calls == N
    full = model.logits(out.tokens, out.orders)  # (b, n, vocab), order positions
    for call, entry in enumerate(calls):
        assert entry["slots"].tolist() == [[call]] * B
        torch.testing.assert_close(entry["logits"][:, 0], full[:, call], rtol=1e-10, atol=1e-10)


def test_each_parallel_target_is_predicted_from_the_context_then_that_target():
    model = make_model()
    calls, on_step = record_steps()
    out, _ = generate(model, steps=3, on_step=on_step)
    assert [e["slots"].shape[1] for e in calls] == [4, 4, 4]  # linear: n / S per step
    for entry in calls:
        for b in range(B):
            lo, c, hi = entry["bounds"][:, b].tolist()
            for j in range(c, hi):
                sigma = out.orders[b].tolist()
                order = sigma[:c] + [sigma[j]] + [p for p in sigma[c:] if p != sigma[j]]
                full = model.logits(out.tokens[b:b + 1], torch.tensor([order]))
                torch.testing.assert_close(entry["logits"][b, j - c], full[0, c],
                                           rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("counts", ["deterministic", "binomial"])
def test_after_every_step_the_cache_holds_the_full_forwards_keys_and_values(counts):
    model = make_model()
    holder = []
    calls, on_step = record_steps(keep_cache_of=holder)
    config = SamplingConfig(steps=5, counts=counts, seed=3)
    sampler = KVCacheSampler(model, batch_size=B, seq_len=N, config=config)
    holder.append(sampler)
    out = sampler.generate(torch.arange(B), on_step=on_step)
    recorder = RecordingCache()
    tokens, positions, targets, _ = model.training_stream(out.tokens, out.orders)
    model.forward_stream(tokens, positions, targets, cache=recorder)
    for entry in calls:
        for b in range(B):
            committed = entry["bounds"][1, b].item() + 1  # slots 0..c are real rows
            for layer, (k, v) in recorder.kv.items():
                torch.testing.assert_close(entry["kv"][layer, 0, b, :, :committed],
                                           k[b, :, :committed], rtol=1e-10, atol=1e-10)
                torch.testing.assert_close(entry["kv"][layer, 1, b, :, :committed],
                                           v[b, :, :committed], rtol=1e-10, atol=1e-10)


def test_a_prompt_is_kept_verbatim_and_read_first():
    model = make_model()
    prompt = torch.tensor([464, 3290, 318, 257])
    tokens = torch.zeros(B, N, dtype=torch.long)
    tokens[:, :4] = prompt
    mask = torch.zeros(B, N, dtype=torch.bool)
    mask[:, :4] = True
    out, _ = generate(model, steps=4, given=(tokens, mask))
    assert (out.tokens[:, :4] == prompt).all()
    assert (out.orders[:, :4] == torch.arange(4)).all()


def test_infilling_changes_only_the_positions_not_given():
    model = make_model()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, GPT2_VOCAB, (B, N), generator=g)
    mask = torch.rand(B, N, generator=g) < 0.5  # a different pattern per sample
    out, _ = generate(model, steps=3, given=(tokens, mask), counts="binomial")
    assert torch.equal(out.tokens[mask], tokens[mask])
    assert (out.tokens[~mask] != tokens[~mask]).float().mean() > 0.9
    for b in range(B):  # given positions are read first, in ascending order
        given = mask[b].nonzero().flatten()
        assert torch.equal(out.orders[b, :len(given)], given)


def test_left_to_right_order_reads_the_rest_in_position_order():
    model = make_model()
    out, _ = generate(model, steps=4, order="l2r")
    assert (out.orders == torch.arange(N)).all()


def test_a_fixed_seed_reproduces_the_samples_whatever_the_batch():
    model = make_model()
    first, _ = generate(model, steps=4, seed=7)
    again, _ = generate(model, steps=4, seed=7)
    other, _ = generate(model, steps=4, seed=8)
    alone, _ = generate(model, steps=4, seed=7, b=1, ids=torch.tensor([2]))
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.orders, again.orders)
    assert not torch.equal(first.tokens, other.tokens)
    assert torch.equal(alone.tokens[0], first.tokens[2])


def test_binomial_batches_with_uneven_steps_match_samples_run_alone():
    model = make_model()
    batch, _ = generate(model, steps=4, counts="binomial", seed=1)
    for b in range(B):
        alone, _ = generate(model, steps=4, counts="binomial", seed=1, b=1, ids=torch.tensor([b]))
        assert torch.equal(alone.tokens[0], batch.tokens[b])


def test_a_short_batch_is_padded_and_the_padding_dropped():
    model = make_model()
    full, _ = generate(model, steps=4, b=3)
    config = SamplingConfig(steps=4)
    sampler = KVCacheSampler(model, batch_size=3, seq_len=N, config=config)
    short = sampler.generate(torch.arange(2))
    assert short.tokens.shape == (2, N) and torch.equal(short.tokens, full.tokens[:2])


def test_padded_vocab_ids_are_never_sampled():
    model = make_model()
    with torch.no_grad():  # the padding ids would win every draw if they were allowed
        model.lm_head.bias[GPT2_VOCAB:] = 100.0
    out, _ = generate(model, steps=4, temperature=2.0)
    assert out.tokens.max() < GPT2_VOCAB


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_binomial_counts_reveal_every_position_by_the_last_step(schedule):
    config = SamplingConfig(steps=8, counts="binomial", schedule=schedule, seed=5)
    given = torch.tensor([0, 3, 12, 1])
    counts = reveal_counts(config, given, 12, torch.arange(4))
    assert counts[:, 0].tolist() == given.tolist() and (counts[:, -1] == 12).all()
    assert (counts.diff(dim=1) >= 0).all()
    model = make_model()
    out, _ = generate(model, steps=8, counts="binomial", schedule=schedule)
    assert out.network_calls <= 8 and (out.tokens < GPT2_VOCAB).all()


def test_deterministic_counts_follow_the_schedule_with_one_token_at_least():
    linear = reveal_counts(SamplingConfig(steps=4), torch.tensor([0, 4]), 12, torch.arange(2))
    assert linear.tolist() == [[0, 3, 6, 9, 12], [4, 6, 8, 10, 12]]
    cosine = reveal_counts(SamplingConfig(steps=6, schedule="cosine"), torch.tensor([0]), 12,
                           torch.arange(1))[0].diff()
    assert (cosine >= 1).all() and cosine[0] < cosine[-1]  # few early, many late


def test_top_k_one_and_greedy_pick_the_same_tokens():
    model = make_model()
    greedy, _ = generate(model, steps=6, temperature=0.0)
    top1, _ = generate(model, steps=6, top_k=1, seed=11)
    assert torch.equal(greedy.tokens, top1.tokens)


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.full((GPT2_VOCAB,), -1e9)
    logits[:4] = probs.log()
    kept = filter_logits(logits, SamplingConfig(top_p=0.8)) > -float("inf")
    assert kept[:4].tolist() == [True, True, False, False] and kept.sum() == 2
    kept = filter_logits(logits, SamplingConfig(top_p=0.81)) > -float("inf")
    assert kept[:4].tolist() == [True, True, True, False]


@pytest.mark.parametrize("top_p, standard, paper", [
    (0.7, 2, 1),  # masses 0.5, 0.8, 0.95, 1: standard stops once 0.7 is reached, paper before
    (0.9, 3, 2),
    (0.4, 1, 1),  # the paper's rule still keeps the most likely token
    (0.99, 4, 3),
])
def test_the_papers_top_p_rule_keeps_the_nucleus_whose_mass_stays_within_p(top_p, standard,
                                                                            paper):
    # no cumulative mass lies within float32 rounding (~1e-7) of a top_p, so both rules are exact
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.full((2, GPT2_VOCAB), -1e9)
    logits[:, :4] = probs.log()
    logits[1, :4] = logits[1, :4].flip(0)  # the nucleus is taken by probability, not by id
    for rule, size in [("standard", standard), ("paper", paper)]:
        kept = filter_logits(logits, SamplingConfig(top_p=top_p, top_p_rule=rule)) > -float("inf")
        assert kept[0, :4].tolist() == [True] * size + [False] * (4 - size)
        assert kept[1, :4].tolist() == [False] * (4 - size) + [True] * size
        assert kept.sum().item() == 2 * size


def test_a_plain_gpt_samples_left_to_right_only():
    model = make_model(plain_gpt(tiny_config()))
    with pytest.raises(UsageError, match="l2r"):
        generate(model, steps=N)
    out, _ = generate(model, steps=N, order="l2r")
    full = model.logits(out.tokens)
    assert full.shape == (B, N, model.config.vocab_size)


def test_bad_settings_are_usage_errors():
    model = make_model()
    for settings, match in [({"top_p": 0.0}, "top_p"), ({"temperature": -1.0}, "temperature"),
                            ({"schedule": "square"}, "schedule"), ({"steps": 0}, "steps"),
                            ({"top_p_rule": "nucleus"}, "top_p_rule")]:
        with pytest.raises(UsageError, match=match):
            generate(model, **settings)
    with pytest.raises(UsageError, match="block size"):
        generate(model, n=17)


@pytest.mark.gpu
@pytest.mark.parametrize("counts", ["deterministic", "binomial"])
def test_cuda_graphs_give_the_same_samples_as_eager_steps(counts):
    model = make_model().cuda()
    outs = []
    for graphs in (False, True):
        config = SamplingConfig(steps=5, counts=counts, seed=2)
        sampler = KVCacheSampler(model, batch_size=B, seq_len=N, config=config, cuda_graphs=graphs)
        outs.append([sampler.generate(torch.arange(B) + 3 * i).tokens for i in range(2)])
    for eager, graphed in zip(*outs, strict=True):
        assert torch.equal(eager, graphed)


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_on_a_gpu_every_step_gives_the_full_forwards_logits(graphs):
    model = make_model().cuda()  # float64: the comparison is exact up to summation order
    calls, on_step = record_steps()
    config = SamplingConfig(steps=N)
    sampler = KVCacheSampler(model, batch_size=B, seq_len=N, config=config, cuda_graphs=graphs)
    out = sampler.generate(torch.arange(B), on_step=on_step)
    full = model.logits(out.tokens, out.orders)
    for call, entry in enumerate(calls):
        torch.testing.assert_close(entry["logits"][:, 0], full[:, call], rtol=1e-10, atol=1e-10)


def test_sampling_under_bf16_autocast_runs_over_fp32_weights():
    """The paper's sample script runs its sampler under autocast: ours takes it too (the cache
    keeps the weights' dtype, the projections come in bf16)."""
    model = make_model().float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, sampler = generate(model, steps=4)
    assert out.tokens.shape == (B, N) and sampler.cache.keys[0].dtype == torch.float32
    assert ((0 <= out.tokens) & (out.tokens < GPT2_VOCAB)).all()


def test_the_two_level_inverse_cdf_draws_what_a_float64_running_sum_over_the_vocabulary_draws():
    """Blocks of 256 summed in float64, then a running sum inside one block: the same token as a
    float64 running sum over all 50,257 (both sum the same fp32 numbers; they differ only
    within ~1e-16 of a tie, which 4,096 uniforms do not hit), never one of probability 0, and
    the short last block (50,257 = 196 x 256 + 81) is drawn from too."""
    g = torch.Generator().manual_seed(0)
    for scale in (0.5, 5.0, 50.0):
        logits = torch.randn(64, 8, GPT2_VOCAB, generator=g) * scale
        logits[..., ::7] = float("-inf")  # filtered out: must never be drawn
        logits[..., -2:] = 3 * scale  # a likely pair in the short last block
        probs = logits.softmax(dim=-1)
        u = torch.rand(64, 8, generator=g, dtype=torch.float64)
        cdf = probs.cumsum(dim=-1, dtype=torch.float64)
        point = torch.minimum(u * cdf[..., -1], torch.nextafter(cdf[..., -1], torch.zeros(())))
        expected = torch.searchsorted(cdf, point[..., None], right=True).squeeze(-1)
        drawn = inverse_cdf(probs, u)
        assert torch.equal(drawn, expected)
        assert (probs.gather(-1, drawn[..., None]) > 0).all()
    assert (drawn >= GPT2_VOCAB - 81).any()


def test_keys_stored_last_give_the_cache_and_samples_of_keys_stored_by_slot():
    """On a CPU the cache keeps keys as (b, h, hd, slots) for the batched matmul (keys_last): the
    same numbers in another layout. Only the matmul's order of summation may differ (float64,
    16-term dot products of O(1) values through 2 layers: ~1e-15), so the caches agree to 1e-12
    after every step, and the tokens are the same."""
    model = make_model()
    runs = {}
    for keys_last in (True, False):
        config = SamplingConfig(steps=5, counts="binomial", seed=4)
        sampler = KVCacheSampler(model, batch_size=B, seq_len=N, config=config)
        mc = model.config
        sampler.cache = StaticKVCache(mc.n_layer, B, mc.n_head, N + 1, mc.head_dim,
                                      torch.float64, sampler.device, keys_last=keys_last)
        caches = []

        def keep(_, caches=caches, cache=sampler.cache):
            caches.append(cache.kv)

        runs[keys_last] = sampler.generate(torch.arange(B), on_step=keep).tokens, caches
    assert torch.equal(runs[True][0], runs[False][0])
    for ours, theirs in zip(runs[True][1], runs[False][1], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_loading_a_checkpoint_and_sampling_eagerly_never_import_dynamo(tmp_path):
    """Importing torch._dynamo takes about a second of a CPU's start-up: trainer/sample.py and the
    evaluation tools build their model to be loaded into, and eager steps need no compiler."""
    model = make_model().float()
    save_consolidated(tmp_path / "final", model.config, model.state_dict(), None)
    script = (
        "import sys, torch\n"
        "from aogpt.model import load_checkpoint\n"
        "from aogpt.model.sampler import KVCacheSampler, SamplingConfig\n"
        f"model = load_checkpoint({str(tmp_path)!r}, weights='raw')\n"
        f"sampler = KVCacheSampler(model, 2, {N}, SamplingConfig(steps=4))\n"
        "sampler.generate(torch.arange(2))\n"
        "print('torch._dynamo' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"
