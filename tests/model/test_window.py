"""Text longer than the block (model/sampler/window.py): each chunk is exactly a generation of the
block given the window it keeps, a sample does not depend on its batch, the stop rules cut where
they say."""

import pytest
import torch
from conftest import perturbed_float64_model

from aogpt import UsageError
from aogpt.model.config import ModelConfig
from aogpt.model.sampler import KVCacheSampler, SamplingConfig
from aogpt.model.sampler.window import (
    CHUNK_STRIDE,
    StopRules,
    check_window,
    chunks,
    generate_long,
    unigram_entropy,
)

BLOCK, W, LENGTH, B = 12, 4, 30, 3


@pytest.fixture(scope="module")
def network():
    config = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=BLOCK, cond_dim=8)
    return perturbed_float64_model(config)


def long(network, settings=None, ids=None, given=None, stop=None, length=LENGTH):
    ids = torch.arange(B) if ids is None else ids
    config = SamplingConfig(seed=2, steps=BLOCK, **(settings or {}))
    samplers = {}

    def sampler_for(positions):
        samplers.setdefault(positions, KVCacheSampler(network, len(ids), positions, config))
        return samplers[positions]

    tokens, mask = given if given is not None else (torch.zeros(length, dtype=torch.long),
                                                    torch.zeros(length, dtype=torch.bool))
    out = generate_long(sampler_for, BLOCK, ids, length, W, tokens.expand(len(ids), -1),
                        mask.expand(len(ids), -1), stop)
    return out, sampler_for


def test_chunks_slide_by_the_block_less_the_window():
    assert chunks(30, 12, 4) == [(0, 12), (8, 20), (16, 28), (24, 30)]
    assert chunks(12, 12, 4) == [(0, 12)]
    assert chunks(13, 12, 11) == [(0, 12), (1, 13)]


@pytest.mark.parametrize("settings", [{}, {"sampler": "speculative", "draft": 3},
                                      {"planner": "margin"}],
                         ids=["exact", "speculative", "margin"])
def test_each_chunk_is_a_generation_of_the_block_given_its_window(network, settings):
    out, sampler_for = long(network, settings)
    text = torch.tensor(out.texts)
    assert text.shape == (B, LENGTH) and out.seams == [12, 20, 28]
    for k, (start, end) in enumerate(chunks(LENGTH, BLOCK, W)):
        given = torch.zeros(B, end - start, dtype=torch.bool)
        given[:, :W if k else 0] = True
        alone = sampler_for(end - start).generate(torch.arange(B) + k * CHUNK_STRIDE,
                                                  text[:, start:end] * given, given)
        assert torch.equal(alone.tokens, text[:, start:end])
    assert all(sorted(order) == list(range(LENGTH)) for order in out.orders)
    assert sum(out.sample_calls) <= out.network_calls * B


def test_a_long_sample_does_not_depend_on_its_batch(network):
    batch, _ = long(network)
    for i in range(B):
        alone, _ = long(network, ids=torch.tensor([i]))
        assert alone.texts[0] == batch.texts[i] and alone.orders[0] == batch.orders[i]


def test_given_text_stays_in_whichever_chunk_covers_it_a_prompt_past_the_block_included(network):
    tokens = torch.randint(0, 50, (LENGTH,))
    mask = torch.zeros(LENGTH, dtype=torch.bool)
    mask[:15] = True  # a prompt longer than the block: the first chunk only slides over it
    mask[22:24] = True  # infill in the third chunk
    out, _ = long(network, given=(tokens, mask))
    for text in out.texts:
        assert torch.equal(torch.tensor(text)[mask], tokens[mask])
    assert all(sorted(order) == sorted(set(range(LENGTH)) - set(mask.nonzero().flatten().tolist()))
               for order in out.orders)


def test_the_stop_rules_cut_where_they_say():
    eos = 7
    assert StopRules(eos=eos).where([1, 7, 2, 3, 7, 5, 7]) == (5, "second end-of-text")
    assert StopRules(eos=eos).where([1, 7, 2, 3]) is None
    assert unigram_entropy([4, 4, 4, 4]) == 0.0
    assert unigram_entropy([1, 2, 3, 4]) == pytest.approx(torch.log(torch.tensor(4.0)).item())
    repetitive = [1, 2] * 20
    assert StopRules(entropy_below=1.0).where(repetitive) == (40, "unigram entropy below 1.0")
    assert StopRules(entropy_below=0.5).where(repetitive) is None


def test_a_stopped_sample_keeps_its_text_and_the_others_go_on(network):
    # the entropy rule with a bound no text of this model stays under: every sample stops after
    # its first chunk, cut at that chunk's end
    out, _ = long(network, stop=StopRules(entropy_below=100.0))
    assert [len(t) for t in out.texts] == [BLOCK] * B
    assert all(s == "unigram entropy below 100.0" for s in out.stopped)
    full, _ = long(network)
    assert all(t == f[:BLOCK] for t, f in zip(out.texts, full.texts, strict=True))


@pytest.mark.parametrize("window", [0, BLOCK, BLOCK + 3])
def test_a_window_that_leaves_no_room_is_one_line(window):
    with pytest.raises(UsageError, match=rf"--window must be in 1..{BLOCK - 1}"):
        check_window(BLOCK, window)
