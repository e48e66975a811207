"""model/sampler.py's given_from_text: a text prompt and infill become the given tokens and mask
that the sampler takes, with the real GPT-2 tokenizer."""

from types import SimpleNamespace

import pytest
import torch
from conftest import perturbed_float64_model

from aogpt import UsageError
from aogpt.data_prep.tokenizer import EOS, load_gpt2
from aogpt.model.config import GPT2_VOCAB, ModelConfig
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, given_from_text

N = 24


@pytest.fixture(scope="module")
def encoding():
    return load_gpt2()


def test_the_prompt_starts_at_0_and_infill_at_its_key(encoding):
    tokens, mask = given_from_text(encoding, N, prompt="Once upon a time",
                                   infill={12: " the river", "20": [13, 198]})
    prompt, river = encoding.encode_ordinary("Once upon a time"), encoding.encode_ordinary(" the river")
    assert tokens[:len(prompt)].tolist() == prompt
    assert tokens[12:12 + len(river)].tolist() == river and tokens[20:22].tolist() == [13, 198]
    expected = list(range(len(prompt))) + list(range(12, 12 + len(river))) + [20, 21]
    assert mask.nonzero().flatten().tolist() == expected
    assert tokens.shape == mask.shape == (N,) and not tokens[~mask].any()


def test_nothing_given_is_an_empty_mask(encoding):
    tokens, mask = given_from_text(encoding, N)
    assert not mask.any() and not tokens.any()


def test_end_of_text_in_the_text_is_plain_text(encoding):
    tokens, mask = given_from_text(encoding, N, prompt="a<|endoftext|>b")
    assert EOS not in tokens[mask].tolist()
    assert encoding.decode(tokens[mask].tolist()) == "a<|endoftext|>b"


def test_a_tokenizer_with_encode_only_is_used_as_is(encoding):
    tokenizer = SimpleNamespace(encode=encoding.encode_ordinary)  # as a transformers tokenizer
    expected = given_from_text(encoding, N, prompt="The city of", infill={10: "Paris"})
    actual = given_from_text(tokenizer, N, prompt="The city of", infill={10: "Paris"})
    assert all(torch.equal(a, e) for a, e in zip(actual, expected, strict=True))


@pytest.mark.parametrize("prompt, infill, message", [
    (None, {"20": "a b c d e f"}, "given text at 20..25 does not fit in --seq-len 24"),
    ("a b", {"1": "c"}, "given text at 1..1 overlaps other given text"),
    ("a", {0: [5]}, "overlaps other given text"),
    (None, {"x": "a"}, "--infill key 'x' is not a token position"),
    (None, {3: 7}, "--infill at 3: give a string or a list of token ids"),
    (None, {3: [GPT2_VOCAB]}, f"--infill at 3: token ids must be in 0..{GPT2_VOCAB - 1}"),
    (None, {-1: "a"}, "does not fit"),
])
def test_bad_given_text_is_refused_with_its_position(encoding, prompt, infill, message):
    with pytest.raises(UsageError) as error:
        given_from_text(encoding, N, prompt=prompt, infill=infill)
    assert message in str(error.value)


def test_the_sampler_keeps_text_where_it_was_given(encoding):
    model = perturbed_float64_model(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=N,
                                                cond_dim=8))
    tokens, mask = given_from_text(encoding, N, prompt="Hello there", infill={15: " the end"})
    sampler = KVCacheSampler(model, batch_size=2, seq_len=N, config=SamplingConfig(steps=4))
    out = sampler.generate(torch.arange(2), tokens.expand(2, -1), mask.expand(2, -1))
    assert torch.equal(out.tokens[:, mask], tokens[mask].expand(2, -1))
    assert torch.equal(out.orders[:, :int(mask.sum())], mask.nonzero().flatten().expand(2, -1))
