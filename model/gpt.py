"""The AO-GPT decoder, and its sigma-GPT and plain-GPT baselines as config switches.

AO-GPT (Xue et al. 2025, the released model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm) is nanoGPT
with RMSNorm, qk-norm, an untied output head with bias, truncated-normal init, and one new idea:
it reads a sequence x in any order σ (orders[:, k] = σ_k) and is told which position to
predict next. Its residual stream has one slot per prediction:

    slot k   token          own position (wpe)    target (wtpe, by AdaLN)   predicts
    0        [None] wnonee  row 0                 σ_0                       x[σ_0]
    k >= 1   x[σ_{k-1}]     row σ_{k-1} + 1       σ_k                       x[σ_k]

Ordinary causal attention then makes slot k see [None] and the first k tokens of the order. The
target position enters only through AdaLN: a 128-d embedding shared by all layers, projected per
block to 6 per-token modulations (shift, scale, gate for attention and MLP) and to 2 (shift,
scale) in the final layer. A slot's modulations depend on its target position alone, so each
forward projects the block_size codes once, into one table per block (adaln_tables), and every
slot gathers its row: block_size rows through each projection instead of one per token. The
paper's code also runs a last slot holding x[σ_{t-1}] with a zero condition; its output is
discarded and causal attention hides it from every other slot, so it is not computed here (the
logits of all t predictions are identical).

Module names follow the paper's code (transformer.wte/wpe/wtpe/wnonee/h/final_layer, attn.c_attn,
adaLN, ...), so importing its checkpoints is an identity map on names (model/official.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from aogpt import UsageError
from aogpt.model.attention import KVCache, attend, attention_bias, attention_kernel, check_backend
from aogpt.model.config import ModelConfig
from aogpt.model.loss import compile_chunk_math, compute_dtype, linear_cross_entropy
from aogpt.model.orders import shuffle


class Norm(nn.Module):
    """RMSNorm (AO-GPT) or LayerNorm (sigma-GPT, nanoGPT).

    The weight is cast to the activations' dtype so that bf16 activations take the fused kernel,
    which accumulates the statistics in fp32 anyway.
    """

    def __init__(self, dim: int, kind: str, bias: bool):
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.ones(dim))
        # an RMSNorm has no bias whatever config.bias says
        self.bias = nn.Parameter(torch.zeros(dim)) if kind == "layer" and bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.to(x.dtype)
        if self.kind == "rms":
            y = F.rms_norm(x, weight.shape, weight, eps=1e-5)
        else:
            bias = None if self.bias is None else self.bias.to(x.dtype)
            y = F.layer_norm(x, weight.shape, weight, bias, eps=1e-5)
        return y.type_as(x)  # autocast may run it in fp32; attention wants q, k like v


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx  # which layer's entries of a KV cache are ours
        self.n_head = config.n_head
        self.kernel = attention_kernel(config.attn_impl, torch.device("cpu"))  # AOGPT decides
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        if config.qk_norm:  # per head, over head_dim, shared by all heads of the layer
            self.q_norm = Norm(config.head_dim, config.norm, bias=False)
            self.k_norm = Norm(config.head_dim, config.norm, bias=False)
        else:
            self.q_norm = self.k_norm = None
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        """x (b, s, d) -> (b, s, d). Causal without mask; see attention.py for mask and cache."""
        b, s, d = x.shape
        q, k, v = self.c_attn(x).view(b, s, 3, self.n_head, d // self.n_head).unbind(2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, h, s, hd)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        y = attend(q, k, v, self.kernel, mask)  # (b, h, s, hd)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, s, d)))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh" if config.gelu == "tanh" else "none")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = Norm(config.n_embd, config.norm, config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = Norm(config.n_embd, config.norm, config.bias)
        self.mlp = MLP(config)
        self.adaLN = config.injection.modulation(config, 6)  # None: a plain pre-norm block

    def forward(self, x: torch.Tensor, adaln_table: torch.Tensor | None = None,
                rows: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        """adaln_table: this block's modulations, (r, 6d), and rows (b, s): each slot's row in it
        (AOGPT.adaln_tables; None without AdaLN)."""
        if self.adaLN is None:
            x = x + self.attn(self.ln_1(x), mask, cache)
            return x + self.mlp(self.ln_2(x))
        # per token: every slot is modulated by its own target position, (b, s, d) each
        modulations = F.embedding(rows, adaln_table)  # (b, s, 6d)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulations.chunk(6, -1)
        x = x + gate_msa * self.attn(modulate(self.ln_1(x), shift_msa, scale_msa), mask, cache)
        return x + gate_mlp * self.mlp(modulate(self.ln_2(x), shift_mlp, scale_mlp))


class FinalLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln_f = Norm(config.n_embd, config.norm, config.bias)
        self.adaLN_final = config.injection.modulation(config, 2)

    def forward(self, x: torch.Tensor, adaln_table: torch.Tensor | None = None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        x = self.ln_f(x)
        if self.adaLN_final is None:
            return x
        shift, scale = F.embedding(rows, adaln_table).chunk(2, -1)
        return modulate(x, shift, scale)


class LMHead(nn.Linear):
    """The output head. Given targets it returns the per-token NLL instead of logits, made in
    chunks (model/loss.py); inside this module's forward so that ZeRO-3 gathers its weights.

    Its weights change only at optimizer steps, so under autocast their bf16 copy (50K x d) can
    be made once per step instead of once per micro-batch: after `weights_changed()` (the trainer
    calls it after every optimizer step) the next forward casts them and later forwards reuse
    that copy until the next call. Without the call (evaluation, a plain training loop) every
    forward casts: an update that the head cannot see (DeepSpeed writes weights through .data,
    which no version counter records) can then never leave a stale copy in use.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cast_weight: torch.Tensor | None = None
        self._reuse_cast = False

    def weights_changed(self) -> None:
        self._reuse_cast, self._cast_weight = True, None

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None,
                chunk_size: int = 0, return_mean: bool = False,
                weights: torch.Tensor | None = None):
        if targets is None:
            return super().forward(hidden)
        cast, dtype = None, compute_dtype(hidden)
        # only a real copy is kept, never an alias of weights that ZeRO-3 gathers into buffers
        if self._reuse_cast and self.weight.dtype != dtype:
            if self._cast_weight is None or self._cast_weight.dtype != dtype:
                self._cast_weight = self.weight.detach().to(dtype)
            cast = self._cast_weight
        return linear_cross_entropy(hidden, self.weight, self.bias, targets, chunk_size,
                                    return_mean, cast, weights)


def _require_left_to_right(orders: torch.Tensor) -> None:
    """A model without target positions (target_injection=none) reads left to right only."""
    message = "model.target_injection=none only reads left to right: pass identity orders"
    left_to_right = (orders == torch.arange(orders.size(1), device=orders.device)).all()
    if orders.device.type == "cpu":
        if not left_to_right:
            raise UsageError(message)
    else:  # asserted on the device without waiting for it: training passes orders every micro-step
        torch._assert_async(left_to_right, message)


class _SkipInit(torch.overrides.TorchFunctionMode):
    """torch.nn.init's functions return their tensor untouched: on meta tensors they still run
    torch's reference kernels, whose first call imports dynamo (a second of a CPU's start-up)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


class AOGPT(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        config.validate()
        check_backend(config.attn_impl)
        self.config = config
        d = config.n_embd
        layers = {
            "wte": nn.Embedding(config.vocab_size, d),
            # row 0: the [None] slot; p + 1: position p
            "wpe": nn.Embedding(config.block_size + 1, d),
        }
        target_table = config.injection.target_table(config)  # of the target positions
        if target_table is not None:
            layers["wtpe"] = target_table
        layers["wnonee"] = nn.Embedding(1, d)
        layers["drop"] = nn.Dropout(config.dropout)
        layers["h"] = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        layers["final_layer"] = FinalLayer(config)
        self.transformer = nn.ModuleDict(layers)
        self.lm_head = LMHead(d, config.vocab_size, bias=config.lm_head_bias)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self._init_weights()
        self.decide_attention_kernel()  # e.g. built under `with torch.device("cuda")`

    @classmethod
    def unfilled(cls, config: ModelConfig) -> AOGPT:
        """The network on the meta device with no values, to be loaded into
        (load_state_dict(..., assign=True)): no time spent initialising weights that are replaced.
        """
        with torch.device("meta"), _SkipInit():
            return cls(config)

    def _init_weights(self) -> None:
        """Every linear and embedding weight ~ N(0, 0.02), cut at 3 std for "trunc_normal";
        biases 0.

        The residual projections (c_proj) get std / sqrt(2 n_layer), GPT-2's scaling that keeps the
        residual stream's variance independent of depth. Norm weights stay 1.
        """
        config = self.config
        for name, module in self.named_modules():
            if not isinstance(module, (nn.Linear, nn.Embedding)):
                continue
            std = config.init_std
            if name.endswith("c_proj"):
                std /= math.sqrt(2 * config.n_layer)
            if config.init == "trunc_normal":
                nn.init.trunc_normal_(module.weight, std=std, a=-3 * std, b=3 * std)
            else:
                nn.init.normal_(module.weight, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        if config.adaln_zero_init:  # DiT/SEDD's adaLN-Zero: every block starts as the identity
            for name, p in self.named_parameters():
                if "adaLN" in name:
                    nn.init.zeros_(p)

    # ---- facts about the network -----------------------------------------------------------------

    @property
    def attention_backend(self) -> str:
        """The kernel causal attention runs on the model's device: "flash_attn", "sdpa" or "math".

        "flash_attn" applies to bf16/fp16 activations; "auto" falls back to SDPA for fp32 ones.
        """
        return self.transformer.h[0].attn.kernel.name

    def decide_attention_kernel(self) -> None:
        """The attention kernel for the device the weights are on: decided when the model is
        built or moved, and not in forward, where a compiled graph cannot ask the device."""
        kernel = attention_kernel(self.config.attn_impl, self.lm_head.weight.device)
        for block in self.transformer.h:
            block.attn.kernel = kernel

    def _apply(self, fn, recurse=True):  # to(), cuda(), half(), ...: nn.Module's one way in
        super()._apply(fn, recurse)
        self.decide_attention_kernel()
        return self

    def num_params(self) -> int:
        """True total: every parameter once (a tied head counts once)."""
        return sum(p.numel() for p in self.parameters())

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups: decay on matrices and embeddings (>= 2-D), none on biases or norms."""
        params = list(self.parameters())
        return [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]

    def flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """Training FLOPs per token, 6N + 12 L d T (forward + backward), for MFU: attention
        counted whole, as nanoGPT and PaLM count it. causal=True halves the attention term,
        6N + 6 L d T, as Megatron and MaxText now count causal attention (a causal kernel
        computes half the scores).

        N counts the parameters used in matmuls: embedding tables are lookups, except wte when the
        head is tied to it. (The paper's script counted the untied wte too, which overstates MFU.)
        """
        lookups = [self.transformer.wpe, self.transformer.wnonee]
        if "wtpe" in self.transformer:
            lookups.append(self.transformer.wtpe)
        if not self.config.tie_embeddings:
            lookups.append(self.transformer.wte)
        n = self.num_params() - sum(m.weight.numel() for m in lookups)
        c = self.config
        return 6 * n + (6 if causal else 12) * c.n_layer * c.n_embd * seq_len

    # ---- the network -----------------------------------------------------------------------------

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor,
              target_positions: torch.Tensor) -> torch.Tensor:
        """Input of the residual stream, x (b, s, d).

        tokens, positions, target_positions: (b, s). Each slot holds `tokens` from original
        `positions` (-1 = the [None] start slot, whose token is ignored) and is asked to predict
        the token at `target_positions` (which sigma-GPT adds here; AO-GPT's AdaLN in each block).
        """
        t = self.transformer
        is_none = (positions < 0)[..., None]
        none = t.wnonee(positions.new_zeros(()))  # (d,); a module call, so ZeRO-3 gathers it
        x = torch.where(is_none, none, t.wte(tokens.clamp(min=0))) + t.wpe(positions + 1)
        x = self.config.injection.embed(x, t["wtpe"] if "wtpe" in t else None, target_positions)
        return t.drop(x)

    def adaln_tables(self, target_positions: torch.Tensor | None = None
                     ) -> tuple[list[torch.Tensor | None], torch.Tensor | None]:
        """The AdaLN modulations as tables, and each slot's row in them: (tables, rows).

        tables: one (r, 6d) table per block, then the final layer's (r, 2d); all None without
        AdaLN. Modulations depend on the target position only, so without target_positions (a
        sampler, once), or when the slots (b, s) outnumber the positions, the tables hold every
        target position (r = block_size) and a slot's row is its target position: training
        projects block_size codes per forward instead of one per token, and backpropagates
        through the rows its slots gathered. A call with fewer slots than positions (a short
        prompt) projects its own slots' codes: r = b * s, one row per slot.
        """
        return self.config.injection.tables(self.transformer, target_positions)

    def forward_stream(self, tokens: torch.Tensor, positions: torch.Tensor,
                       target_positions: torch.Tensor, mask: torch.Tensor | str | None = None,
                       cache: KVCache | None = None,
                       adaln_tables: list[torch.Tensor | None] | None = None) -> torch.Tensor:
        """The network on explicit slots (see `embed`): final hidden states (b, s, d).

        Logits are self.lm_head(hidden). Causal over the slots unless `mask` (boolean, True = may
        attend, or attention.BIDIRECTIONAL) says otherwise; `cache` is a KV cache for incremental
        decoding (attention.KVCache); adaln_tables: the tables of every target position,
        self.adaln_tables()[0], made beforehand (a sampler's), else made here.
        """
        x = self.embed(tokens, positions, target_positions)
        tables, rows = ((adaln_tables, target_positions) if adaln_tables is not None
                        else self.adaln_tables(target_positions))
        mask = attention_bias(mask, x)  # converted once for all layers
        recompute = (self.config.activation_checkpointing and self.training
                     and torch.is_grad_enabled())
        for block, table in zip(self.transformer.h, tables[:-1], strict=True):
            if recompute:
                x = checkpoint(block, x, table, rows, mask, cache, use_reentrant=False)
            else:
                x = block(x, table, rows, mask, cache)
        return self.transformer.final_layer(x, tables[-1], rows)

    def training_stream(self, idx: torch.Tensor, orders: torch.Tensor | None = None):
        """The slots (see `embed`) for sequences idx (b, t) read in `orders`, and their targets.

        Returns tokens, positions, target_positions (the inputs of forward_stream) and targets,
        each (b, t): slot 0 is [None], slot k holds the (k-1)-th token of the order, and every
        slot k is asked for the k-th, whose token id is targets[:, k].
        """
        idx = idx.long()  # e.g. uint16 straight from the MDS shards
        b, t = idx.shape
        if t > self.config.block_size:
            raise UsageError(f"sequence length {t} exceeds model.block_size "
                             f"{self.config.block_size}")
        if orders is None:
            orders = torch.arange(t, device=idx.device).expand(b, t)
        elif orders.shape != idx.shape:
            raise UsageError(f"orders {tuple(orders.shape)} must have the shape of idx {(b, t)}")
        elif not self.config.any_order:
            _require_left_to_right(orders)
        targets = shuffle(idx, orders)  # (b, t): slot k predicts the k-th token of the order
        return (*self.slots(targets, orders), targets)

    @staticmethod
    def slots(in_order: torch.Tensor, orders: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens, positions, target_positions (the inputs of forward_stream) for the tokens
        in_order (b, L) read at orders (b, L): slot 0 is [None], slot k holds the (k-1)-th token
        of the order at its position and asks for the k-th. L may stop short of the sequence."""
        start = torch.full_like(orders[:, :1], -1)  # the [None] slot
        return (torch.cat([start, in_order[:, :-1]], dim=1),
                torch.cat([start, orders[:, :-1]], dim=1), orders)

    def forward(self, idx: torch.Tensor, orders: torch.Tensor | None = None,
                return_mean: bool = False, weights: torch.Tensor | None = None):
        """-log p of the k-th token of each order given the ones before it: (b, t) fp32 (fp64
        for a float64 model).

        idx (b, t) token ids; orders (b, t) permutations of 0..t-1 (None = left to right). The
        training loss is the mean: return_mean=True returns (nll, nll.mean()), whose mean
        backpropagates without a device sync (model/loss.py). weights (t,) or (b, t): the k-th
        prediction's weight in that mean, (nll * weights).mean() (order.weighting; the nll stays
        unweighted); None is the plain mean. The logits are made config.loss_chunk_size tokens
        at a time.
        """
        hidden, targets = self.hidden_states(idx, orders)
        if weights is not None:
            weights = weights.to(hidden.device).expand_as(targets)
        return self.lm_head(hidden, targets, self.config.loss_chunk_size, return_mean, weights)

    def nll_and_hidden(self, idx: torch.Tensor, orders: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """What forward returns, (b, t), and the final hidden states it came from, (b, t, d):
        hidden[:, k] is the state that predicts the k-th token of the order (self.lm_head(hidden)
        gives its logits), for a caller that wants more of a slot than its NLL."""
        hidden, targets = self.hidden_states(idx, orders)
        return self.lm_head(hidden, targets, self.config.loss_chunk_size), hidden

    def hidden_states(self, idx: torch.Tensor, orders: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """The final hidden states of idx read in orders, (b, t, d), and their targets (b, t)."""
        tokens, positions, target_positions, targets = self.training_stream(idx, orders)
        return self.forward_stream(tokens, positions, target_positions), targets

    def compile_for_training(self, scope: str = "block", mode: str | None = None) -> None:
        """torch.compile the network and the loss's per-chunk softmax (model/loss.py).

        scope "block": each block's forward is compiled, not its module call, so that hooks
        around it (ZeRO-3's parameter gathering) stay eager; all blocks share one graph.
        "network": forward_stream as one graph (embeddings, AdaLN tables, blocks, final layer),
        so inductor also fuses across block boundaries (a residual add with the next norm); it
        compiles for longer and holds no hooks. Shapes are static either way: a run compiles
        once per sequence shape and never again. mode: torch.compile's ("reduce-overhead": the
        graphs replayed as CUDA graphs).
        """
        if scope == "network":
            self.forward_stream = torch.compile(self.forward_stream, dynamic=False, mode=mode)
        else:
            for block in self.transformer.h:
                block.forward = torch.compile(block.forward, dynamic=False, mode=mode)
        compile_chunk_math()

    def token_nll(self, idx: torch.Tensor, orders: torch.Tensor | None = None) -> torch.Tensor:
        """Same as calling the model (the name of the user-facing API)."""
        return self(idx, orders)

    def logits(self, idx: torch.Tensor, orders: torch.Tensor | None = None) -> torch.Tensor:
        """Full logits (b, t, vocab), fp32 or fp64, in order positions: logits[:, k] predicts
        idx[:, orders[:, k]]."""
        logits = self.lm_head(self.hidden_states(idx, orders)[0])
        return logits.to(torch.promote_types(logits.dtype, torch.float32))
