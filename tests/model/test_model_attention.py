"""Attention backends agree, are chosen and reported as documented, and support a KV cache."""

import pytest
import torch

from aogpt import UsageError
from aogpt.model import AOGPT
from aogpt.model.attention import BIDIRECTIONAL, attend, flash_attn_func, math_attention
from aogpt.model.config import ModelConfig


def tiny_config(**changes) -> ModelConfig:
    return ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, cond_dim=8, **changes)


def qkv(b=2, h=3, s=9, hd=8, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, h, s, hd, generator=g).to(device=device, dtype=dtype) for _ in range(3)]


def test_sdpa_and_math_attention_agree_causal_and_masked():
    # fp32 at assert_close's defaults (atol 1e-5 + rtol 1.3e-6): outputs are weighted means of
    # |v| < 4 over 9 keys from 8-term scores, so another summation order (kernel, CPU, threads)
    # moves them by ~(9 + 8) x 4 x 2^-24 ~ 4e-6 at worst (measured 2e-7); a wrong mask or scale
    # moves them by O(0.1).
    q, k, v = qkv()
    torch.testing.assert_close(attend(q, k, v, "sdpa"), attend(q, k, v, "math"))
    mask = torch.rand(9, 9, generator=torch.Generator().manual_seed(1)) < 0.6
    mask |= torch.eye(9, dtype=torch.bool)  # every query sees something
    torch.testing.assert_close(attend(q, k, v, "sdpa", mask), attend(q, k, v, "math", mask))


def test_a_lower_triangular_mask_is_the_causal_attention():
    q, k, v = qkv()
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    torch.testing.assert_close(attend(q, k, v, "sdpa", causal), attend(q, k, v, "sdpa"))


@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_bidirectional_is_the_attention_of_an_all_true_mask(impl):
    q, k, v = qkv()
    everything = torch.ones(9, 9, dtype=torch.bool)
    torch.testing.assert_close(attend(q, k, v, impl, BIDIRECTIONAL),
                               attend(q, k, v, "math", everything))


def test_models_with_sdpa_and_math_backends_give_the_same_nll():
    # fp32 NLLs ~11 (ulp 1e-6) that differ only through the attention's rounding (~1e-7, damped
    # by the 0.02-scale weights): defaults allow 2.4e-5
    idx = torch.randint(0, 50257, (2, 16))
    orders = torch.rand(2, 16).argsort(1)
    nll = {}
    for impl in ("sdpa", "math"):
        torch.manual_seed(0)
        nll[impl] = AOGPT(tiny_config(attn_impl=impl))(idx, orders)
    torch.testing.assert_close(nll["sdpa"], nll["math"])


def test_auto_backend_is_sdpa_without_a_flash_attn_gpu():
    model = AOGPT(tiny_config())
    if not torch.cuda.is_available():
        assert model.attention_backend == "sdpa"
    assert AOGPT(tiny_config(attn_impl="math")).attention_backend == "math"


def test_the_kernel_is_decided_when_the_model_moves_and_never_in_forward(monkeypatch):
    """A compiled graph cannot ask the device what it supports: forward only reads the kernel
    decided when the model was built or moved."""
    from aogpt.model import attention

    asked = []
    supported = attention.flash_attn_supported
    monkeypatch.setattr(attention, "flash_attn_supported",
                        lambda d: asked.append(d) or supported(d))
    model = AOGPT(tiny_config()).to(torch.float64)
    assert asked and {block.attn.kernel.name for block in model.transformer.h} == {"sdpa"}
    asked.clear()
    model(torch.randint(0, 50257, (1, 8)), torch.randperm(8)[None])
    assert asked == []
    model.to("meta")
    assert asked == [torch.device("meta")]


def test_asking_for_flash_attn_where_it_cannot_run_is_a_usage_error():
    idx = torch.randint(0, 50257, (1, 8))
    with pytest.raises(UsageError, match="flash"):  # not installed, or installed but on CPU
        AOGPT(tiny_config(attn_impl="flash_attn"))(idx)


NO_FLASH = ("flash-attn is not installed" if flash_attn_func is None
            else "flash-attn needs a CUDA GPU, there is none" if not torch.cuda.is_available()
            else "")


@pytest.mark.gpu
@pytest.mark.skipif(bool(NO_FLASH), reason=NO_FLASH)
def test_flash_attn_matches_sdpa_and_math_in_bf16():
    q, k, v = qkv(s=128, hd=64, dtype=torch.bfloat16, device="cuda")
    # bf16 inputs and outputs (unit 2^-8); the math path also rounds its scores (~N(0, 1)) and
    # probabilities to bf16, a few units of the outputs (|y| < 1): 2e-2 is ~5 units
    flash = attend(q, k, v, "flash_attn")
    torch.testing.assert_close(flash, attend(q, k, v, "sdpa"), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(flash, math_attention(q, k, v), rtol=2e-2, atol=2e-2)


class ConcatCache:
    """The smallest KV cache: keeps every layer's keys/values and appends the new ones."""

    def __init__(self):
        self.kv = {}

    def update(self, layer, k, v):
        if layer in self.kv:
            k = torch.cat([self.kv[layer][0], k], dim=2)
            v = torch.cat([self.kv[layer][1], v], dim=2)
        self.kv[layer] = (k, v)
        return k, v


def test_slot_by_slot_decoding_with_a_kv_cache_reproduces_the_full_forward():
    torch.manual_seed(0)
    model = AOGPT(tiny_config()).double().eval()
    idx = torch.randint(0, 50257, (2, 10))
    orders = torch.rand(2, 10).argsort(1)
    tokens, positions, targets, _ = model.training_stream(idx, orders)
    full = model.forward_stream(tokens, positions, targets)
    cache = ConcatCache()
    for k in range(10):
        seen = torch.ones(1, k + 1, dtype=torch.bool)  # one new query sees all k+1 slots so far
        step = model.forward_stream(tokens[:, k:k + 1], positions[:, k:k + 1], targets[:, k:k + 1],
                                    mask=seen, cache=cache)
        torch.testing.assert_close(step[:, 0], full[:, k], rtol=1e-12, atol=1e-12)
