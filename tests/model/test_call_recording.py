"""Call recording (model/sampler/recording.py): what each network call did to each sample, read
back from the strategies' own state. Over a generation the recorded calls make final exactly the
sample's order; the speculative sampler's accepted and rejected drafts add up to its counters and
hold the tokens drafted; a planner's candidates come best first with the chosen one first; a
window's calls are in the text's positions; and recording changes no token."""

import pytest
import torch
from conftest import perturbed_float64_model

from aogpt.model.config import ModelConfig
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, given_tokens
from aogpt.model.sampler.window import generate_long

N, B = 16, 3
WAYS = {"parallel": {"steps": 5}, "binomial": {"steps": 6, "counts": "binomial"},
        "speculative": {"sampler": "speculative", "draft": 3},
        "margin": {"planner": "margin", "reveal": 2}, "threshold": {"planner": "threshold",
                                                                    "threshold": 0.3}}


@pytest.fixture(scope="module")
def network():
    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=N, cond_dim=8, vocab_size=32)
    model = perturbed_float64_model(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)  # peaked distributions: drafts are rejected too
    return model


GIVEN = given_tokens(N, infill={0: [1, 2], 9: [5]})


def generate(network, settings: dict, record_calls: bool = True):
    sampler = KVCacheSampler(network, B, N, SamplingConfig(seed=2, **settings))
    tokens, mask = (t.expand(B, -1) for t in GIVEN)
    return sampler.generate(torch.arange(B), tokens, mask, record_calls=record_calls)


def generated_order(out, i: int) -> list[int]:
    return [p for p in out.orders[i].tolist() if not GIVEN[1][p]]


@pytest.mark.parametrize("way", WAYS)
def test_the_calls_make_final_exactly_the_samples_order(network, way):
    out = generate(network, WAYS[way])
    for i in range(B):
        assert [p for call in out.calls[i] for p in call.get("final", [])] == generated_order(
            out, i)


@pytest.mark.parametrize("way", ["speculative", "margin"])  # the ways with state to read back
def test_recording_changes_no_token(network, way):
    recorded, plain = generate(network, WAYS[way]), generate(network, WAYS[way], False)
    assert torch.equal(recorded.tokens, plain.tokens) and plain.calls is None


def test_speculative_drafts_are_accepted_or_rejected_as_its_counters_say(network):
    out = generate(network, WAYS["speculative"])
    rejections = 0
    for i in range(B):
        pending: dict[int, int] = {}
        for call in out.calls[i]:
            for position in call.get("accepted", []):
                assert pending.pop(position) == out.tokens[i, position]  # the draft stays
            for position, token in call.get("rejected", []):
                assert pending.pop(position) == token
                assert position in call["final"]  # drawn again from the residual, final
                rejections += 1
            pending.update(call.get("drafts", []))
        assert pending == {}  # every draft decided
        accepted = sum(len(call.get("accepted", [])) for call in out.calls[i])
        decided = accepted + sum(len(call.get("rejected", [])) for call in out.calls[i])
        assert (accepted, decided) == (out.stats["drafts_accepted"][i],
                                       out.stats["drafts_decided"][i])
        assert len(out.calls[i]) == out.sample_calls[i]
    assert rejections > 0  # the peaked model makes some: the rule above is exercised


def test_a_planners_candidates_come_best_first_the_chosen_first(network):
    out = generate(network, WAYS["margin"])
    for i in range(B):
        for call in out.calls[i]:
            if "final" not in call:
                continue
            scores = [score for _, score in call["candidates"]]
            assert scores == sorted(scores, reverse=True)
            assert [p for p, _ in call["candidates"][:len(call["final"])]] == call["final"]


def test_a_windows_calls_are_in_the_texts_positions(network):
    def sampler_for(positions):
        return KVCacheSampler(network, B, positions, SamplingConfig(sampler="speculative",
                                                                    draft=2))

    length = 2 * N
    tokens, mask = given_tokens(length, infill={0: [1, 2, 3]})
    out = generate_long(sampler_for, N, torch.arange(B), length, N // 2, tokens.expand(B, -1),
                        mask.expand(B, -1), record_calls=True)
    for i in range(B):
        assert [p for call in out.calls[i] for p in call.get("final", [])] == out.orders[i]
        assert max(p for call in out.calls[i] for p, _ in call.get("drafts", [])) >= N
