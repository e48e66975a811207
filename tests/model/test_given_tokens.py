"""model/sampler/given.py's given_tokens: a prompt and infill, text or token ids, become the given
tokens and mask that the sampler takes (text through the real GPT-2 tokenizer); bad input is
refused in words of positions, which every caller (a command, the Hugging Face wrapper, lm-eval)
can use."""

from types import SimpleNamespace

import pytest
import torch
from conftest import perturbed_float64_model

from aogpt import UsageError
from aogpt.data_prep.tokenizer import EOS, load_gpt2
from aogpt.model.config import GPT2_VOCAB, ModelConfig
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, given_tokens

N = 24


@pytest.fixture(scope="module")
def encoding():
    return load_gpt2()


def test_the_prompt_starts_at_0_and_infill_at_its_key(encoding):
    tokens, mask = given_tokens(N, prompt="Once upon a time",
                                infill={12: " the river", "20": [13, 198]}, encoding=encoding)
    prompt = encoding.encode_ordinary("Once upon a time")
    river = encoding.encode_ordinary(" the river")
    assert tokens[:len(prompt)].tolist() == prompt
    assert tokens[12:12 + len(river)].tolist() == river and tokens[20:22].tolist() == [13, 198]
    expected = list(range(len(prompt))) + list(range(12, 12 + len(river))) + [20, 21]
    assert mask.nonzero().flatten().tolist() == expected
    assert tokens.shape == mask.shape == (N,) and not tokens[~mask].any()


def test_token_ids_need_no_tokenizer_and_may_be_a_tensor():
    """lm-eval's contexts and the Hugging Face wrapper's `given` are token ids; a tokenizer's
    (1, n) tensor reads as its n ids."""
    tokens, mask = given_tokens(N, prompt=[464, 1748], infill={10: torch.tensor([[13, 198]]),
                                                               "15": []})
    assert tokens[:2].tolist() == [464, 1748] and tokens[10:12].tolist() == [13, 198]
    assert mask.nonzero().flatten().tolist() == [0, 1, 10, 11]


def test_nothing_given_is_an_empty_mask():
    tokens, mask = given_tokens(N)
    assert not mask.any() and not tokens.any()


def test_end_of_text_in_the_text_is_plain_text(encoding):
    tokens, mask = given_tokens(N, prompt="a<|endoftext|>b", encoding=encoding)
    assert EOS not in tokens[mask].tolist()
    assert encoding.decode(tokens[mask].tolist()) == "a<|endoftext|>b"


def test_a_tokenizer_with_encode_only_is_used_as_is(encoding):
    tokenizer = SimpleNamespace(encode=encoding.encode_ordinary)  # as a transformers tokenizer
    expected = given_tokens(N, prompt="The city of", infill={10: "Paris"}, encoding=encoding)
    actual = given_tokens(N, prompt="The city of", infill={10: "Paris"}, encoding=tokenizer)
    assert all(torch.equal(a, e) for a, e in zip(actual, expected, strict=True))


@pytest.mark.parametrize("prompt, infill, message", [
    (None, {"20": "a b c d e f"}, "given text at 20..25 does not fit in a sequence of 24 tokens"),
    ("a b", {"1": "c"}, "given text at 1..1 overlaps other given text"),
    ("a", {0: [5]}, "given text at 0..0 overlaps other given text"),
    (None, {"x": "a"}, "infill key 'x' is not a token position"),
    (None, {3: 7}, "given tokens at 3: give a string or a list of token ids"),
    (None, {3: [1.5]}, "given tokens at 3: give a string or a list of token ids"),
    (None, {3: [GPT2_VOCAB]}, f"given tokens at 3: token ids must be in 0..{GPT2_VOCAB - 1}"),
    ([-1], None, f"given tokens at 0: token ids must be in 0..{GPT2_VOCAB - 1}"),
    (None, {-1: "a"}, "given text at -1..-1 does not fit in a sequence of 24 tokens"),
])
def test_bad_given_tokens_are_refused_with_their_position(encoding, prompt, infill, message):
    with pytest.raises(UsageError) as error:
        given_tokens(N, prompt=prompt, infill=infill, encoding=encoding)
    assert str(error.value) == message


def test_text_without_a_tokenizer_is_refused():
    with pytest.raises(UsageError) as error:
        given_tokens(N, infill={4: "the river"})
    assert str(error.value) == "given text at 4 needs a tokenizer: pass encoding, or give token ids"


def test_the_sampler_keeps_text_where_it_was_given(encoding):
    model = perturbed_float64_model(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=N,
                                                cond_dim=8))
    tokens, mask = given_tokens(N, prompt="Hello there", infill={15: " the end"},
                                encoding=encoding)
    sampler = KVCacheSampler(model, batch_size=2, seq_len=N, config=SamplingConfig(steps=4))
    out = sampler.generate(torch.arange(2), tokens.expand(2, -1), mask.expand(2, -1))
    assert torch.equal(out.tokens[:, mask], tokens[mask].expand(2, -1))
    assert torch.equal(out.orders[:, :int(mask.sum())], mask.nonzero().flatten().expand(2, -1))
