"""Speculative sampling (model/sampler/speculative.py) draws exactly what one token per call
draws: judged against the exact joint of a model small enough to enumerate, with a test that a
wrong acceptance rule fails."""

import itertools

import pytest
import torch
from conftest import assert_cache_holds_the_full_forward, perturbed_float64_model

from aogpt import UsageError
from aogpt.model.config import ModelConfig
from aogpt.model.orders import LEFT_TO_RIGHT
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, speculative, token_probs

N = 12  # tokens per sequence of the float64 test model (its block is 16)
B = 4


def tiny_model(vocab_size: int | None = None, block_size: int = 16, sharpen: float = 30.0,
               n_layer: int = 2, n_embd: int = 32):
    """A float64 model whose conditionals depend strongly on the context (a sharpened head), so
    that drafts from fewer known tokens often differ from what the verifier says."""
    extra = {} if vocab_size is None else {"vocab_size": vocab_size}
    config = ModelConfig(n_layer=n_layer, n_head=2, n_embd=n_embd, block_size=block_size,
                         cond_dim=8, **extra)
    model = perturbed_float64_model(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model


def generate(model, config: SamplingConfig, ids: torch.Tensor, n: int = N, given=None):
    sampler = KVCacheSampler(model, batch_size=len(ids), seq_len=n, config=config)
    tokens, mask = given if given is not None else (None, None)
    if given is not None:
        tokens, mask = tokens.expand(len(ids), -1), mask.expand(len(ids), -1)
    return sampler.generate(ids, tokens, mask), sampler


# ---- the exact joint, by enumeration ----------------------------------------------------------


def exact_joint(model, n: int, config: SamplingConfig, given=None):
    """Every sequence of n tokens (the given ones fixed) and its probability under one token per
    call with `config`'s settings: the mean over the orders the sampler draws (the given
    positions first, then a uniform permutation of the rest, or left to right) of the product of
    the filtered conditionals along the order."""
    vocab = model.config.vocab_size
    sequences = torch.tensor(list(itertools.product(range(vocab), repeat=n)))
    fixed = [] if given is None else given[1].nonzero().flatten().tolist()
    if given is not None:
        sequences = sequences[(sequences[:, fixed] == given[0][fixed]).all(dim=1)]
    free = [i for i in range(n) if i not in fixed]
    joint = torch.zeros(len(sequences), dtype=torch.float64)
    permutations = ([free] if config.order == LEFT_TO_RIGHT.word
                    else list(itertools.permutations(free)))
    with torch.no_grad():
        for permutation in permutations:
            orders = torch.tensor(fixed + list(permutation)).expand(len(sequences), n)
            probs = token_probs(model.logits(sequences, orders), config).double()
            in_order = sequences.gather(1, orders)[..., None]
            joint += probs.gather(2, in_order)[:, len(fixed):, 0].prod(dim=1)
    return sequences, joint / len(permutations)


def chi_square_p_value(model, n: int, given, config: SamplingConfig, samples: int) -> float:
    """Pearson's test of `samples` draws of the sampler against the exact joint (cells expected
    fewer than 5 times pooled): the p-value."""
    sequences, joint = exact_joint(model, n, config, given)
    cell = {tuple(s): i for i, s in enumerate(sequences.tolist())}
    counts = torch.zeros(len(sequences), dtype=torch.float64)
    batch = 2500
    sampler = KVCacheSampler(model, batch_size=batch, seq_len=n, config=config)
    for first in range(0, samples, batch):
        ids = torch.arange(first, first + batch)
        tokens, mask = (None, None) if given is None else (given[0].expand(batch, -1),
                                                           given[1].expand(batch, -1))
        for row in sampler.generate(ids, tokens, mask).tokens.tolist():
            counts[cell[tuple(row)]] += 1
    expected = joint * samples
    big = expected >= 5
    statistic = ((counts - expected) ** 2 / expected)[big].sum()
    pooled_expected, pooled_count = expected[~big].sum(), counts[~big].sum()
    cells = int(big.sum())
    if pooled_expected > 0:
        statistic += (pooled_count - pooled_expected) ** 2 / pooled_expected
        cells += 1
    dof = torch.tensor((cells - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, statistic / 2))


# 4 tokens at 4 positions free (after a one-token prompt): 256 sequences, 24 orders, 10,000
# samples. The one-layer model's conditionals depend strongly on the context (a sharpened head),
# so drafts from fewer known tokens often differ from the verifier, which is what a wrong rule
# needs to show (a model whose tokens barely depend on each other accepts every draft).
EXACT_VOCAB, EXACT_SAMPLES, SHARPEN = 4, 10_000, 16.0


def exact_case(prompt: bool):
    """(positions, given): 4 free positions, after a one-token prompt if asked."""
    if not prompt:
        return 4, None
    tokens, mask = torch.zeros(5, dtype=torch.long), torch.zeros(5, dtype=torch.bool)
    tokens[0], mask[0] = 3, True
    return 5, (tokens, mask)


def exact_model():
    return tiny_model(vocab_size=EXACT_VOCAB, block_size=8, sharpen=SHARPEN, n_layer=1, n_embd=16)


@pytest.mark.parametrize("draft", [2, 4])
@pytest.mark.parametrize("prompt", [False, True], ids=["nothing-given", "one-given"])
def test_speculative_samples_follow_the_exact_joint_of_one_token_per_call(draft, prompt):
    model = exact_model()
    config = SamplingConfig(sampler="speculative", draft=draft)
    assert chi_square_p_value(model, *exact_case(prompt), config, EXACT_SAMPLES) > 1e-3


@pytest.mark.parametrize("draft", [2, 4])
@pytest.mark.parametrize("prompt", [False, True], ids=["nothing-given", "one-given"])
def test_the_same_test_fails_for_a_rule_that_redraws_rejections_without_the_residual(
        draft, prompt, monkeypatch):
    monkeypatch.setattr(speculative, "residual", lambda q, p: q)  # the common mistake
    model = exact_model()
    config = SamplingConfig(sampler="speculative", draft=draft)
    assert chi_square_p_value(model, *exact_case(prompt), config, EXACT_SAMPLES) < 1e-6


def test_temperature_and_top_k_shape_drafts_and_verifier_alike():
    """The truncated, tempered model is the target: its joint is what the samples follow."""
    model = exact_model()
    config = SamplingConfig(sampler="speculative", draft=3, temperature=0.7, top_k=2)
    assert chi_square_p_value(model, 4, None, config, EXACT_SAMPLES) > 1e-3


def test_the_papers_sampler_with_fewer_calls_than_tokens_fails_the_test():
    """Revealing two tokens per call independently (Lemma 1) is not the model's joint: the
    test sees it, so it can tell an exact sampler from one that is not."""
    model = exact_model()
    assert chi_square_p_value(model, 4, None, SamplingConfig(steps=2), EXACT_SAMPLES) < 1e-6


# ---- the cache, the batch and the calls -------------------------------------------------------


@pytest.mark.parametrize("draft", [1, 2, 4, 8])
def test_greedy_speculative_decoding_gives_the_tokens_of_one_token_per_call(draft):
    """Greedy, the joint is one sequence: any slip of the cache or of the verification shows."""
    model = tiny_model()
    one_per_call, _ = generate(model, SamplingConfig(steps=N, temperature=0.0), torch.arange(B))
    fast, _ = generate(model, SamplingConfig(sampler="speculative", draft=draft, temperature=0.0),
                       torch.arange(B))
    assert torch.equal(fast.tokens, one_per_call.tokens)
    assert torch.equal(fast.orders, one_per_call.orders)
    assert (fast.sample_calls < N).all()  # drafts were accepted


def test_after_generation_the_cache_holds_the_full_forwards_keys_and_values():
    model = tiny_model()
    out, sampler = generate(model, SamplingConfig(sampler="speculative", draft=3, seed=5),
                            torch.arange(B))
    assert_cache_holds_the_full_forward(model, out, sampler)


# the trees' are slow: tests/trainer/test_sample_cli.py checks a tree's batch invariance in seconds
@pytest.mark.parametrize("prompt, tree", [
    pytest.param(False, 1, id="nothing-given-chain"), pytest.param(True, 1, id="prompt-chain"),
    pytest.param(False, 3, id="nothing-given-tree", marks=pytest.mark.slow),
    pytest.param(True, 3, id="prompt-tree", marks=pytest.mark.slow)])
def test_a_sample_does_not_depend_on_the_batch_it_runs_in(prompt, tree):
    model = tiny_model()
    config = SamplingConfig(sampler="speculative", draft=4, tree=tree, seed=3)
    given = None
    if prompt:
        tokens, mask = torch.zeros(N, dtype=torch.long), torch.zeros(N, dtype=torch.bool)
        tokens[:3], mask[:3] = torch.tensor([464, 3290, 318]), True
        given = (tokens, mask)
    batch, _ = generate(model, config, torch.arange(8), given=given)
    for i in (0, 5):
        alone, _ = generate(model, config, torch.tensor([i]), given=given)
        assert torch.equal(alone.tokens[0], batch.tokens[i])
        assert alone.sample_calls[0] == batch.sample_calls[i]
    if prompt:
        assert (batch.tokens[:, :3] == given[0][:3]).all()


def test_every_call_makes_a_token_final_and_accepted_drafts_save_calls():
    model = tiny_model()
    out, _ = generate(model, SamplingConfig(sampler="speculative", draft=4), torch.arange(B))
    calls, decided, accepted = out.sample_calls, out.stats["drafts_decided"], out.stats[
        "drafts_accepted"]
    # each call makes final one token besides the drafts it accepts (the last call none, when
    # it verifies drafts up to the end of the order)
    assert ((calls + accepted >= N) & (calls + accepted <= N + 1)).all()
    assert (accepted <= decided).all() and (accepted > 0).all()
    assert out.network_calls == int(calls.max())


def test_infilling_keeps_the_given_tokens_and_reads_them_first():
    model = tiny_model()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50257, (N,), generator=g)
    mask = torch.rand(N, generator=g) < 0.5
    out, _ = generate(model, SamplingConfig(sampler="speculative", draft=2), torch.arange(B),
                      given=(tokens, mask))
    assert (out.tokens[:, mask] == tokens[mask]).all()
    assert (out.orders[:, :int(mask.sum())] == mask.nonzero().flatten()).all()


def test_a_draft_below_one_is_refused():
    with pytest.raises(UsageError, match="draft must be >= 1"):
        KVCacheSampler(tiny_model(), 1, N, SamplingConfig(sampler="speculative", draft=0))


# ---- draft trees: several candidates per drafted position -------------------------------------


@pytest.mark.slow  # 10,000 samples: 7 to 16 s each on 2 cores
@pytest.mark.parametrize("tree", [2, 3])
@pytest.mark.parametrize("prompt", [False, True], ids=["nothing-given", "one-given"])
def test_draft_trees_follow_the_exact_joint_of_one_token_per_call(tree, prompt):
    model = exact_model()
    config = SamplingConfig(sampler="speculative", draft=2, tree=tree)
    assert chi_square_p_value(model, *exact_case(prompt), config, EXACT_SAMPLES) > 1e-3


@pytest.mark.slow  # 10,000 samples: 7 to 16 s each on 2 cores
@pytest.mark.parametrize("tree", [1, 3])
def test_left_to_right_speculative_samples_follow_the_left_to_right_joint(tree):
    """--order l2r --sampler speculative: left-to-right text from an any-order model, exactly
    its one-token-per-call distribution along the identity order (the drafts ahead come from the
    model's marginals of the positions after the known prefix)."""
    model = exact_model()
    config = SamplingConfig(sampler="speculative", draft=2, tree=tree, order="l2r")
    assert chi_square_p_value(model, 4, None, config, EXACT_SAMPLES) > 1e-3


@pytest.mark.slow  # 10,000 samples: 7 to 16 s each on 2 cores
@pytest.mark.parametrize("tree", [2, 3])
def test_the_same_test_fails_for_a_tree_that_does_not_renormalise_what_is_left(tree,
                                                                                monkeypatch):
    """After a rejection the next candidate is tried against the residual and the proposal
    without the rejected mass, each renormalised: a rule that skips the renormalisation accepts
    later candidates too rarely, and the test must see it."""
    monkeypatch.setattr(speculative, "renormalised", lambda mass: mass)
    model = exact_model()
    config = SamplingConfig(sampler="speculative", draft=2, tree=tree)
    assert chi_square_p_value(model, 4, None, config, EXACT_SAMPLES) < 1e-6


@pytest.mark.parametrize("tree", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_greedy_draft_trees_give_the_tokens_of_one_token_per_call(tree):
    model = tiny_model()
    one_per_call, _ = generate(model, SamplingConfig(steps=N, temperature=0.0), torch.arange(B))
    fast, _ = generate(model, SamplingConfig(sampler="speculative", draft=3, tree=tree,
                                             temperature=0.0), torch.arange(B))
    assert torch.equal(fast.tokens, one_per_call.tokens)


def test_after_a_tree_generation_the_cache_holds_the_full_forwards_keys_and_values():
    model = tiny_model()
    out, sampler = generate(model, SamplingConfig(sampler="speculative", draft=3, tree=3, seed=5),
                            torch.arange(B))
    assert_cache_holds_the_full_forward(model, out, sampler)


@pytest.mark.slow  # 48 samples of 12 tokens at GPT-2's vocabulary: ~14 s on 2 cores
def test_more_candidates_accept_more_drafts_in_fewer_calls_never_more_than_tokens():
    model = tiny_model()
    runs = {tree: generate(model, SamplingConfig(sampler="speculative", draft=4, tree=tree),
                           torch.arange(16))[0] for tree in (1, 2, 3)}
    accepted = {tree: out.stats["drafts_accepted"].sum() / out.stats["drafts_decided"].sum()
                for tree, out in runs.items()}
    assert accepted[1] < accepted[2] < accepted[3]
    assert runs[3].sample_calls.sum() < runs[1].sample_calls.sum()
    assert all((out.sample_calls <= N).all() for out in runs.values())


# ---- branches: the positions after a candidate other than the first, on its own rows ---------


@pytest.mark.slow  # 10,000 samples: 7 to 16 s each on 2 cores
@pytest.mark.parametrize("tree", [2, 3])
@pytest.mark.parametrize("prompt", [False, True], ids=["nothing-given", "one-given"])
def test_draft_trees_with_branches_follow_the_exact_joint_of_one_token_per_call(tree, prompt):
    model = exact_model()
    config = SamplingConfig(sampler="speculative", draft=3, tree=tree, tree_depth=2)
    assert chi_square_p_value(model, *exact_case(prompt), config, EXACT_SAMPLES) > 1e-3


def branch_rows_seeing_the_first_candidate(monkeypatch):
    """The plausible wrong branch: its rows see entry j's first candidate, as the chain's rows
    do, instead of the candidate the branch is of."""
    right = speculative.SpeculativeSampling._candidate_rows

    def wrong(self, keys):
        tokens, positions, targets, write, mask = right(self, keys)
        n, row = self.sampler.seq_len, torch.arange(self.siblings)
        entry, depth = row // ((self.tree - 1) * self.branch), row % self.branch
        key, follows = torch.arange(keys), depth >= 1
        candidate_slot = (key == (n + 1 + row - depth)[:, None]) & follows[:, None]
        first_slot = key == (self.final[:, None] + entry + 1)[..., None]
        fed = ((write != n) & follows)[..., None]
        return tokens, positions, targets, write, (
            mask[:, 0] & ~candidate_slot | fed & first_slot)[:, None]

    monkeypatch.setattr(speculative.SpeculativeSampling, "_candidate_rows", wrong)


@pytest.mark.parametrize("wrong", [False, True], ids=["branch", "wrong-branch"])
def test_after_a_generation_with_branches_the_cache_holds_the_full_forward(wrong, monkeypatch):
    """The branches' rows of the entries they made final are the slots' keys and values; a
    branch whose rows saw the first candidate instead of its own leaves other ones there (and
    targets conditioned on a token that is not final, which the chi-square test needs far more
    samples to see)."""
    if wrong:
        branch_rows_seeing_the_first_candidate(monkeypatch)
    model = tiny_model()
    config = SamplingConfig(sampler="speculative", draft=3, tree=3, tree_depth=2, seed=5)
    out, sampler = generate(model, config, torch.arange(B))
    if not wrong:
        assert_cache_holds_the_full_forward(model, out, sampler)
        return
    with pytest.raises(AssertionError, match="not close"):
        assert_cache_holds_the_full_forward(model, out, sampler)


def test_greedy_draft_trees_with_branches_give_the_tokens_of_one_token_per_call():
    model = tiny_model()
    one_per_call, _ = generate(model, SamplingConfig(steps=N, temperature=0.0), torch.arange(B))
    fast, _ = generate(model, SamplingConfig(sampler="speculative", draft=3, tree=3,
                                             tree_depth=2, temperature=0.0), torch.arange(B))
    assert torch.equal(fast.tokens, one_per_call.tokens)


def test_branches_save_calls_never_more_than_tokens_and_are_batch_invariant():
    model = tiny_model()
    runs = {depth: generate(model, SamplingConfig(sampler="speculative", draft=4, tree=3,
                                                  tree_depth=depth, seed=1), torch.arange(16))[0]
            for depth in (0, 3)}
    assert runs[3].sample_calls.sum() < runs[0].sample_calls.sum()
    for out in runs.values():
        assert (out.sample_calls <= N).all()
        assert (out.stats["drafts_accepted"] <= out.stats["drafts_decided"]).all()
    alone, _ = generate(model, SamplingConfig(sampler="speculative", draft=4, tree=3,
                                              tree_depth=3, seed=1), torch.tensor([5]))
    assert torch.equal(alone.tokens[0], runs[3].tokens[5])
    assert alone.sample_calls[0] == runs[3].sample_calls[5]


def test_a_branch_deeper_than_the_draft_is_its_draft_less_one_and_below_zero_is_refused():
    model = tiny_model()
    deep, _ = generate(model, SamplingConfig(sampler="speculative", draft=3, tree=2,
                                             tree_depth=9, seed=2), torch.arange(B))
    most, _ = generate(model, SamplingConfig(sampler="speculative", draft=3, tree=2,
                                             tree_depth=2, seed=2), torch.arange(B))
    assert torch.equal(deep.tokens, most.tokens)
    with pytest.raises(UsageError, match=r"tree_depth must be >= 0 \(positions verified on a "
                                         r"branch\), got -1"):
        KVCacheSampler(model, 1, N, SamplingConfig(sampler="speculative", tree=2, tree_depth=-1))


def test_a_tree_below_one_is_refused():
    with pytest.raises(UsageError, match="tree must be >= 1"):
        KVCacheSampler(tiny_model(), 1, N, SamplingConfig(sampler="speculative", tree=0))


# ---- pre-drafts: the drafts after a redrawn position, from rows that saw only final tokens ----


@pytest.mark.slow  # 10,000 samples: 7 to 16 s each on 2 cores
@pytest.mark.parametrize("order, tree, prompt", [("l2r", 1, False), ("random", 1, True),
                                                 ("random", 3, False)])
def test_pre_drafts_follow_the_exact_joint_of_one_token_per_call(order, tree, prompt):
    model = exact_model()
    config = SamplingConfig(sampler="speculative", draft=2, tree=tree, predraft=2, order=order)
    positions, given = exact_case(prompt) if order == "random" else (4, None)
    assert chi_square_p_value(model, positions, given, config, EXACT_SAMPLES) > 1e-3


@pytest.mark.slow  # 10,000 samples: 7 to 16 s on 2 cores
def test_the_same_test_fails_for_pre_drafts_verified_against_the_drafts_they_replaced(
        monkeypatch):
    """A pre-draft is accepted by its own proposal, the row it was drawn from: one verified
    against the proposal of the draft it replaced (drawn from a row that saw the rejected
    draft) is accepted at the wrong rate, and the test must see it."""
    right = speculative.SpeculativeSampling._take_predrafts

    def keeping_old_proposals(self, *args):
        before = self.draft_probs.clone()
        right(self, *args)
        self.draft_probs.copy_(before)

    monkeypatch.setattr(speculative.SpeculativeSampling, "_take_predrafts", keeping_old_proposals)
    config = SamplingConfig(sampler="speculative", draft=2, predraft=2, order="l2r")
    assert chi_square_p_value(exact_model(), 4, None, config, EXACT_SAMPLES) < 1e-6


def test_after_a_generation_with_pre_drafts_the_cache_holds_the_full_forward():
    model = tiny_model()
    for tree in (1, 3):
        config = SamplingConfig(sampler="speculative", draft=3, tree=tree, predraft=2, seed=5)
        out, sampler = generate(model, config, torch.arange(B))
        assert_cache_holds_the_full_forward(model, out, sampler)


def test_greedy_pre_drafts_give_the_tokens_of_one_token_per_call():
    model = tiny_model()
    one_per_call, _ = generate(model, SamplingConfig(steps=N, temperature=0.0, order="l2r"),
                               torch.arange(B))
    fast, _ = generate(model, SamplingConfig(sampler="speculative", draft=3, predraft=3,
                                             temperature=0.0, order="l2r"), torch.arange(B))
    assert torch.equal(fast.tokens, one_per_call.tokens)


def test_pre_drafts_never_take_more_calls_than_tokens_and_are_batch_invariant():
    """Whether pre-drafts save calls depends on the model (its marginals of the positions ahead
    against its conditionals after a rejection): tests/benchmarks/test_perfect_drafts.py shows
    they do on a synthetic language, with a rule it checks is this sampler's."""
    model = tiny_model()
    runs = {r: generate(model, SamplingConfig(sampler="speculative", draft=4, predraft=r,
                                              order="l2r", seed=1), torch.arange(16))[0]
            for r in (0, 4)}
    rejected = {r: (out.stats["drafts_decided"] - out.stats["drafts_accepted"]).sum()
                for r, out in runs.items()}
    assert rejected[0] > 0  # else there is nothing to pre-draft after
    assert not torch.equal(runs[4].tokens, runs[0].tokens)  # the pre-drafts were drafted
    for out in runs.values():
        assert (out.sample_calls <= N).all()
        assert (out.stats["drafts_accepted"] <= out.stats["drafts_decided"]).all()
    alone, _ = generate(model, SamplingConfig(sampler="speculative", draft=4, predraft=4,
                                              order="l2r", seed=1), torch.tensor([5]))
    assert torch.equal(alone.tokens[0], runs[4].tokens[5])
    assert alone.sample_calls[0] == runs[4].sample_calls[5]


def test_more_pre_drafts_than_drafts_are_the_draft_and_below_zero_is_refused():
    model = tiny_model()
    many, _ = generate(model, SamplingConfig(sampler="speculative", draft=2, predraft=9, seed=2),
                       torch.arange(B))
    most, _ = generate(model, SamplingConfig(sampler="speculative", draft=2, predraft=2, seed=2),
                       torch.arange(B))
    assert torch.equal(many.tokens, most.tokens)
    with pytest.raises(UsageError, match=r"predraft must be >= 0 \(fresh drafts after a "
                                         r"rejection\), got -1"):
        KVCacheSampler(model, 1, N, SamplingConfig(sampler="speculative", predraft=-1))
