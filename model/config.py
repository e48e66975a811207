"""The network's shape and variant switches: AO-GPT, its sigma-GPT baseline and a plain GPT.

Defaults are the paper's AO-GPT small (model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm): RMSNorm,
qk-norm, per-token AdaLN on the target position, untied head with bias, truncated-normal init.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args, get_type_hints

from aogpt import UsageError
from aogpt.model.injection import VARIANTS
from aogpt.model.injection import TargetInjection as Variant

GPT2_VOCAB = 50257
GPT2_EOS = GPT2_VOCAB - 1  # <|endoftext|>, the last of GPT-2's ids
PADDED_VOCAB = 50304  # GPT-2's vocab rounded up to a multiple of 64, for faster matmuls

TargetInjection = Literal[tuple(VARIANTS)]  # the decoder variants (model/injection.py)


def require_choices(config, names: tuple[str, ...], prefix: str = "") -> None:
    """UsageError naming the first of the dataclass `config`'s Literal fields `names` that holds
    none of its type's values, and listing them."""
    hints = get_type_hints(type(config))
    for name in names:
        if getattr(config, name) not in get_args(hints[name]):
            raise UsageError(f"{prefix}{name}={getattr(config, name)!r} is unknown: use one of "
                             f"{', '.join(get_args(hints[name]))}")


@dataclass
class ModelConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024  # tokens per sequence; the residual stream has one more slot, [None]
    # GPT-2's 50257 tokens padded; a synthetic language (data_prep/synthetic.py) has its own few
    vocab_size: int = PADDED_VOCAB
    # How the next target's position reaches the network: a decoder variant of
    # model/injection.py, which says what each does ("adaln" is AO-GPT's AdaLN)
    target_injection: TargetInjection = "adaln"
    cond_dim: int = 128
    norm: Literal["rms", "layer"] = "rms"
    # the MLP's GELU: "exact" (erf; the paper's, nanoGPT's) or "tanh" (the approximation GPT-2
    # was trained with, Hugging Face's gelu_new: for model.init_from a GPT-2)
    gelu: Literal["exact", "tanh"] = "exact"
    qk_norm: bool = True
    bias: bool = True  # biases of the block's linear layers (norms never have one in "rms")
    tie_embeddings: bool = False
    lm_head_bias: bool = True
    init: Literal["trunc_normal", "normal"] = "trunc_normal"
    init_std: float = 0.02
    adaln_zero_init: bool = False  # SEDD/DiT's adaLN-Zero; the paper's AO-GPT does not use it
    # start training from a left-to-right GPT (model/warm_start.py): a local Hugging Face GPT-2
    # folder or a checkpoint of a gpt_* run; at step 0 the model reads left to right as it did
    init_from: str | None = None
    dropout: float = 0.0
    # "auto": flash-attn's kernel on a supported GPU when installed, else PyTorch SDPA.
    attn_impl: Literal["auto", "sdpa", "flash_attn", "math"] = "auto"
    activation_checkpointing: bool = False
    # Cross-entropy is computed over chunks of this many tokens so the full (tokens x vocab)
    # logits never exist at once; 0 computes them in one piece.
    loss_chunk_size: int = 4096

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def injection(self) -> Variant:
        """The decoder variant model.target_injection names (model/injection.py)."""
        return VARIANTS[self.target_injection]

    @property
    def any_order(self) -> bool:
        """Whether the network is told each target's position, so can read and score any order.
        A plain GPT (target_injection=none) cannot: it reads left to right only."""
        return self.injection.any_order

    @property
    def family(self) -> str:
        """The model's name by its target injection, for reports and logs."""
        return self.injection.family

    def require_any_order(self, fix: str) -> None:
        """Refuses any-order use of a left-to-right-only model; `fix` says what to ask instead."""
        if not self.any_order:
            raise UsageError(f"this model is a {self.family} (model.target_injection=none) and "
                             f"reads left to right only: {fix}")

    @property
    def reads_gpt2(self) -> bool:
        """Whether the vocabulary holds GPT-2's tokens: False for a model of a synthetic language
        (data_prep/synthetic.py), whose few token ids are no text."""
        return self.vocab_size >= GPT2_VOCAB

    def require_gpt2(self, what: str) -> None:
        """Refuses `what` (text in, text out) for a model whose vocabulary is not GPT-2's."""
        if not self.reads_gpt2:
            raise UsageError(f"{what} needs a model of GPT-2 text: this one has a vocabulary of "
                             f"{self.vocab_size} tokens (a synthetic language), not GPT-2's "
                             f"{GPT2_VOCAB}")

    def validate(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "cond_dim"):
            if getattr(self, name) <= 0:
                raise UsageError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise UsageError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.loss_chunk_size < 0:
            raise UsageError(f"model.loss_chunk_size must be >= 0, got {self.loss_chunk_size}")
        if self.init_std <= 0:
            raise UsageError(f"model.init_std must be positive, got {self.init_std}")
        require_choices(self, ("target_injection", "norm", "gelu", "init", "attn_impl"),
                        prefix="model.")


def small() -> ModelConfig:
    """The paper's "124M" AO-GPT (170.6M parameters with its untied head and AdaLN)."""
    return ModelConfig(n_layer=12, n_head=12, n_embd=768)


def medium() -> ModelConfig:
    """The paper's "350M" AO-GPT (425.8M parameters)."""
    return ModelConfig(n_layer=24, n_head=16, n_embd=1024)


def tiny() -> ModelConfig:
    """A few hundred thousand parameters in the blocks: trains on CPU in minutes, for tests and
    the demo."""
    return ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=128, cond_dim=32)


def sigma_gpt(base: ModelConfig) -> ModelConfig:
    """The paper repo's sigma-GPT baseline at the size of `base` (125.16M params at small's).

    Target position added at the input (a block_size x n_embd table), plain nanoGPT otherwise:
    LayerNorm, no qk-norm, no biases, head tied to wte without bias, normal init.
    """
    return replace(base, target_injection="sigma_sum", norm="layer", qk_norm=False, bias=False,
                   tie_embeddings=True, lm_head_bias=False, init="normal")


def plain_gpt(base: ModelConfig) -> ModelConfig:
    """AO-GPT's network without any target information: a left-to-right-only GPT."""
    return replace(base, target_injection="none")
