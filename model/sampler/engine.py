"""The sampler's engine: the order, the static KV cache and the network call every way of choosing
tokens shares (SamplingConfig picks one of ways.py's WAYS, whose strategy makes the calls; what a
strategy may read and write of the engine is strategy.py's).

Each sample draws its order σ up front (given positions first, the rest as its reading reads them).
The training stream has one slot per prediction (model/gpt.py):

    slot k   holds x[σ_{k-1}] at its position ([None] for k = 0)   condition σ_k   predicts x[σ_k]

A call feeds each sample a contiguous run of slots lo..hi-1: the real slots lo..c (tokens in
their order; slots below lo are in the cache) and, in slots c+1..hi-1, copies of slot c's token
with their own targets σ_k. The "parallel generation mask" lets row k see

    key j   iff   j == k   or   (j <= k and j < c)

i.e. the cache and the real rows causally, and of the copies only the diagonal: a copy computes
exactly what training computes for the order "σ_0..σ_{c-1}, then σ_k", the distribution of
x[σ_k] given the c tokens before it, as if the tokens between were not there. A real row's keys
and values equal a full forward's (a slot's target is fixed by the order), so the cache keeps
them; copies write slots the next call overwrites. The rows whose distributions the strategy
reads, its targets, are slots t..hi-1 for a t <= c of its choosing: the paper's sampler
(parallel.py) reads slot c and the copies, the speculative one (speculative.py) every row.

A call is small (b x rows) and made of hundreds of small operations, so its cost is their
launches, not their arithmetic. On a GPU each call shape is captured once as a CUDA graph and
replayed (the capture costs milliseconds); compiled by inductor besides (fused kernels), a call
is faster still, but compiling costs seconds per shape, which only a long run earns back
(trainer/sample.py's --compile auto decides). Should compiling or capturing fail, the sampler
says why in one warning line and goes on eagerly. The AdaLN modulations, which depend on the
target position only, are tables built once per sampler (AOGPT.adaln_tables), and the mask
becomes an attention bias once per call, not in every layer.

The cache is preallocated once, [n_layer, 2, b, h, n+1, hd]: slot n is a trash slot where rows
that only pad a batch write. Samples of a batch may be at different places (binomial counts,
per-sample prompts, drafts accepted): every sample runs the same number of rows, and the rows
past its own run are padding.

Randomness is counter-based (model/orders.py): the order and every uniform a token is drawn or
accepted with depend only on (seed, sample id, position), never on the batch a sample runs in.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from aogpt import UsageError
from aogpt.model.config import GPT2_VOCAB
from aogpt.model.gpt import AOGPT
from aogpt.model.orders import (
    ANY_ORDER,
    LEFT_TO_RIGHT,
    Stream,
    counter_uniform,
    per_reading,
    shuffle,
    unshuffle,
)
from aogpt.model.sampler.cache import StaticKVCache
from aogpt.model.sampler.config import SamplingConfig
from aogpt.model.sampler.draw import position_uniforms
from aogpt.model.sampler.outputs import Generation
from aogpt.model.sampler.recording import CallRecorder
from aogpt.model.sampler.strategy import KEY_BLOCK, StepOutput
from aogpt.model.sampler.ways import DEFAULT_SAMPLER, way_of

# What failed once in this process ("compiling", "capturing"): later samplers do not try it again
# (a broken compiler would cost every one of them its seconds of trying) and warn no more.
FAILED_FAST_PATHS: set[str] = set()


def _position_keys(config: SamplingConfig, sample_ids: torch.Tensor, n: int) -> torch.Tensor:
    positions = torch.arange(n, device=sample_ids.device)
    return positions.double().expand(len(sample_ids), n) / n


def _random_keys(config: SamplingConfig, sample_ids: torch.Tensor, n: int) -> torch.Tensor:
    positions = torch.arange(n, device=sample_ids.device)
    return counter_uniform(config.seed, sample_ids[:, None], Stream.SAMPLE_ORDER, positions)


# SamplingConfig.order -> keys in [0, 1) of a sample's positions (b, n), ascending in the order
# they are generated (model/orders.py per_reading: a new reading needs its entry here)
ORDER_KEYS = per_reading("model/sampler/engine.py ORDER_KEYS", {
    LEFT_TO_RIGHT.word: _position_keys,
    ANY_ORDER.word: _random_keys,
})


def draw_orders(config: SamplingConfig, given_mask: torch.Tensor,
                sample_ids: torch.Tensor) -> torch.Tensor:
    """(b, n) int64: given positions first (ascending), then the others in the order of the
    ORDER_KEYS of the reading the way's strategy asks for (config.order, or a planner's blocks in
    position order, so that each block's positions come together)."""
    n = given_mask.shape[1]
    positions = torch.arange(n, device=given_mask.device)
    reading = way_of(config).strategy.order_reading(config)
    keys = ORDER_KEYS[reading](config, sample_ids, n)
    keys = torch.where(given_mask, positions.double() - n, keys)
    return keys.argsort(dim=1, stable=True)


@dataclass
class Rows:
    """A call's rows as KVCacheSampler.feed takes them ((b, rows) each; mask (b, 1, rows, keys);
    read_rows (b, reads): the rows whose logits come back), and the target slots of the reads
    that are the order's (b, targets) with whether each is one (the rest pad)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    target_positions: torch.Tensor
    write_slots: torch.Tensor
    mask: torch.Tensor
    read_rows: torch.Tensor
    target_slots: torch.Tensor
    valid: torch.Tensor

    def fed(self) -> tuple[torch.Tensor, ...]:
        return (self.tokens, self.positions, self.target_positions, self.write_slots, self.mask,
                self.read_rows)

    def extended(self, tokens: torch.Tensor, positions: torch.Tensor,
                 target_positions: torch.Tensor, write_slots: torch.Tensor,
                 mask: torch.Tensor) -> Rows:
        """These rows and more after them (each (b, more); mask (b, 1, more, keys)), whose
        logits are read after theirs, in their order."""
        more = torch.arange(tokens.size(1), device=tokens.device) + self.tokens.size(1)
        return Rows(*(torch.cat(pair, dim=1) for pair in (
            (self.tokens, tokens), (self.positions, positions),
            (self.target_positions, target_positions), (self.write_slots, write_slots))),
            torch.cat([self.mask, mask], dim=2),
            torch.cat([self.read_rows, more.expand(len(tokens), -1)], dim=1),
            self.target_slots, self.valid)


def chained(*calls: Callable[[StepOutput], None] | None) -> Callable[[StepOutput], None] | None:
    """One on_step that calls each of `calls` given (None if none is)."""
    calls = [call for call in calls if call is not None]
    if len(calls) <= 1:
        return calls[0] if calls else None

    def each(step: StepOutput) -> None:
        for call in calls:
            call(step)

    return each


class KVCacheSampler:
    """Generates batches of batch_size sequences of seq_len tokens with `model`.

        sampler = KVCacheSampler(model, batch_size=32, seq_len=1024, config=SamplingConfig())
        out = sampler.generate(torch.arange(32))     # sample ids 0..31
        out.tokens                                   # (32, 1024)

    A prompt and infill (given_tokens) are the same for every sample of the batch:

        tokens, mask = given_tokens(1024, prompt="The city of", infill={40: " river"},
                                    encoding=encoding)
        out = sampler.generate(torch.arange(32), tokens.expand(32, -1), mask.expand(32, -1))

    The model runs in its own dtype (cast it to bf16 on a GPU) and must be in eval mode.
    cuda_graphs: each call shape captured once and replayed (None: on a CUDA device). compile:
    each call shape through torch.compile (inductor), fullgraph (None: off; it pays only over
    many calls, which the caller knows). setup_seconds: the time the calls that compiled or
    captured a new shape took, apart from generation's.
    """

    def __init__(self, model: AOGPT, batch_size: int, seq_len: int, config: SamplingConfig,
                 cuda_graphs: bool | None = None, compile: bool | None = None):
        config.validate()
        self.way = way_of(config)
        mc = model.config
        if not 1 <= seq_len <= mc.block_size:
            raise UsageError(f"seq_len must be in 1..{mc.block_size} (the model's block size), "
                             f"got {seq_len}")
        if model.training:
            raise UsageError("the model is in training mode: call model.eval() before sampling")
        if config.order != LEFT_TO_RIGHT.word:
            mc.require_any_order(f"use order={LEFT_TO_RIGHT.word}")
        if self.way.any_order:
            mc.require_any_order(f"{self.way.picked_by}={self.way.name!r} asks for positions ahead "
                                 f"of the next one: use sampler={DEFAULT_SAMPLER!r}")
        weight = model.lm_head.weight
        self.model, self.config, self.seq_len, self.batch_size = model, config, seq_len, batch_size
        self.vocab = min(mc.vocab_size, GPT2_VOCAB)  # the ids a token may take (no padded ones)
        self.device = weight.device
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and self.device.type != "cuda":
            raise UsageError("CUDA graphs need the model on a CUDA device")
        self.cuda_graphs = self.cuda_graphs and "capturing" not in FAILED_FAST_PATHS
        self.compiled = bool(compile) and "compiling" not in FAILED_FAST_PATHS
        # compiled: one graph per call shape, so shapes are bucketed to keep them few
        self.bucketed = self.cuda_graphs or self.compiled
        self.strategy = self.way.strategy(self)
        self._network_step = (torch.compile(self.strategy.step, dynamic=False, fullgraph=True)
                              if self.compiled else self.strategy.step)
        self.prepared_shapes: set[tuple[int, int, int]] = set()
        self.setup_seconds = 0.0
        with torch.no_grad():
            self.adaln_tables, _ = model.adaln_tables()  # fixed addresses, refreshed in place
        self._tables_version = self._weights_version()
        layout = self.strategy.cache_layout()  # slot seq_len: the trash; scratch ones after it
        self.cache = StaticKVCache(mc.n_layer, batch_size, mc.n_head, seq_len + 1 + layout.scratch,
                                   mc.head_dim, weight.dtype, self.device, layout.keys_last)
        # the state a call reads and writes (fixed addresses, as CUDA graphs need)
        self.orders = torch.zeros(batch_size, seq_len, dtype=torch.long, device=self.device)
        self.ordered = torch.zeros(batch_size, seq_len + 1, dtype=torch.long, device=self.device)
        self.uniforms = torch.zeros(batch_size, seq_len, dtype=torch.float64, device=self.device)
        self._graphs: dict[tuple[int, int, int], Callable[[], tuple]] = {}
        self._pool = None

    @torch.no_grad()
    def generate(self, sample_ids: torch.Tensor, given_tokens: torch.Tensor | None = None,
                 given_mask: torch.Tensor | None = None,
                 on_step: Callable[[StepOutput], None] | None = None,
                 forced_tokens: torch.Tensor | None = None,
                 record_calls: bool = False) -> Generation:
        """Samples (b,) ids (b <= batch_size; they key the randomness). given_tokens and
        given_mask (b, n) fix tokens at chosen positions (a prompt, or any infill pattern).
        forced_tokens (b, n), a strategy that takes them only (the planners): teacher forcing,
        each revealed position takes its token from there instead of drawing it, so the planner's
        order and the exact log-likelihood along it score that text (evaluation; eager calls
        only). record_calls: what each call did to each sample, in Generation.calls
        (recording.py)."""
        b, n, full = len(sample_ids), self.seq_len, self.batch_size
        if not 1 <= b <= full:
            raise UsageError(f"generate takes 1..{full} sample ids, got {b}")
        if given_mask is None:
            given_mask = torch.zeros(b, n, dtype=torch.bool)
            given_tokens = torch.zeros(b, n, dtype=torch.long)
        if given_mask.shape != (b, n) or given_tokens is None or given_tokens.shape != (b, n):
            raise UsageError("given_tokens and given_mask must both be (samples, seq_len) = "
                             f"{(b, n)}")
        if given_mask.any() and int(given_tokens[given_mask.bool()].max()) >= self.vocab:
            raise UsageError(f"given token ids must be in 0..{self.vocab - 1} (the model's "
                             "vocabulary)")
        pad = torch.arange(full) % b  # a short batch repeats its samples; the copies are dropped
        sample_ids, given_tokens, given_mask = (t.to(self.device)[pad]
                                                for t in (sample_ids, given_tokens, given_mask))
        self._refresh_tables()
        if forced_tokens is not None:
            if not self.strategy.takes_forced or self.bucketed:
                raise UsageError("forced tokens score a text along a planner's order: they need "
                                 "a planner and eager calls (no CUDA graphs, not compiled)")
            forced_tokens = forced_tokens.to(self.device)[pad]
        self.orders.copy_(draw_orders(self.config, given_mask, sample_ids))
        self.ordered[:, :n].copy_(shuffle(given_tokens.long(), self.orders))
        self.uniforms.copy_(position_uniforms(self.config, sample_ids, n))
        recorder = CallRecorder(self, given_mask[:b].sum(dim=1).cpu()) if record_calls else None
        done = self.strategy.generate(sample_ids, given_mask, chained(recorder, on_step),
                                      forced_tokens)
        tokens = unshuffle(self.ordered[:, :n], self.orders)
        return Generation(tokens[:b].clone(), self.orders[:b].clone(), done.network_calls,
                          done.rows, done.sample_calls[:b].cpu(),
                          {name: value[:b].cpu() for name, value in done.stats.items()},
                          recorder.calls if recorder else None)

    # ---- the network call --------------------------------------------------------------------

    def network(self, lo: torch.Tensor, first_target: torch.Tensor, c: torch.Tensor,
                hi: torch.Tensor, rows: int, targets: int, keys: int,
                copy_targets: torch.Tensor | None = None):
        """The network on slots lo..max(hi, c+1)-1 of each sample (lo, first_target, c, hi: (b, 1)
        int64): real slots up to c, copies of slot c's token after it; every row writes its keys
        and values to its slot (padding rows to the trash slot n). Feeds `rows` rows, attends
        over the first `keys` cache slots, and returns the logits of the target slots
        first_target..hi-1 (b, targets, vocab) fp32 or wider, those slots (b, targets) and
        whether each is a target (b, targets) bool (the rest pad to `targets`).

        A row's target is the position of its slot in the order, or with copy_targets (b, k)
        the copies from slot c on ask for those positions instead (a planner's candidates,
        whose order is not decided yet)."""
        laid = self.lay_out(lo, first_target, c, hi, rows, targets, keys, copy_targets)
        return self.feed(*laid.fed()), laid.target_slots, laid.valid

    def lay_out(self, lo: torch.Tensor, first_target: torch.Tensor, c: torch.Tensor,
                hi: torch.Tensor, rows: int, targets: int, keys: int,
                copy_targets: torch.Tensor | None = None) -> Rows:
        """network()'s rows, not yet fed: a strategy that feeds rows of its own besides (a draft
        tree's candidates) extends them (Rows.extended) and feeds them all at once."""
        n = self.seq_len
        slot = lo + torch.arange(rows, device=self.device)  # (b, rows)
        fed = slot < torch.maximum(hi, c + 1).clamp(max=n)
        # a row at slot k carries the token of slot min(k, c): its own, or a_m's for the copies
        tokens, positions = self.slot_inputs(torch.minimum(slot, c))
        target_positions = self.orders.gather(1, slot.clamp(max=n - 1))
        if copy_targets is not None:
            candidate = (slot - c).clamp(min=0, max=copy_targets.size(1) - 1)
            target_positions = torch.where(slot >= c, copy_targets.gather(1, candidate),
                                           target_positions)
        query = torch.where(fed, slot, c)[:, None, :, None]  # (b, 1, rows, 1)
        key = torch.arange(keys, device=self.device)
        mask = (key == query) | ((key <= query) & (key < c[:, None, None]))  # (b, 1, rows, keys)
        target_slots = first_target + torch.arange(targets, device=self.device)  # (b, targets)
        row = (target_slots - lo).clamp(min=0, max=rows - 1)
        # padding rows write to the trash slot n and attend like row c (all finite keys)
        return Rows(tokens, positions, target_positions, torch.where(fed, slot, n), mask, row,
                    target_slots, target_slots < hi)

    def slot_inputs(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The token and position a row at cache slot k carries: the order's token before σ_k
        and its position, or the [None] slot's (position -1) at slot 0. (tokens, positions),
        each the shape of `slots`."""
        index = (slots - 1).clamp(min=0, max=self.seq_len - 1)
        return (self.ordered.gather(1, index),
                torch.where(slots == 0, -1, self.orders.gather(1, index)))

    def feed(self, tokens: torch.Tensor, positions: torch.Tensor, target_positions: torch.Tensor,
             write_slots: torch.Tensor, mask: torch.Tensor, read_rows: torch.Tensor
             ) -> torch.Tensor:
        """The network on rows laid out by the caller, each (b, rows) int64: the token a row
        carries, its position (-1: [None]), the position it asks for, and the cache slot its keys
        and values go to; mask (b, 1, rows, keys) bool, the cache slots 0..keys-1 each row attends
        to. Returns the logits of read_rows (b, targets): (b, targets, vocab) fp32 or wider.
        network() lays out the parallel generation mask's rows; a strategy whose rows it cannot
        describe (a draft tree's candidates, strategy.py) lays out its own."""
        self.cache.prepare(write_slots, mask.size(-1))
        hidden = self.model.forward_stream(tokens, positions, target_positions, mask, self.cache,
                                           self.adaln_tables)
        chosen = hidden.gather(1, read_rows[..., None].expand(-1, -1, hidden.size(-1)))
        logits = self.model.lm_head(chosen)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def call(self, rows: int, targets: int, keys: int):
        """One call of the strategy's step (the network and its draws): eager, compiled, or
        replayed from the CUDA graph of its shape. A new shape's first call compiles and captures
        it (its time goes to setup_seconds); should either fail, one warning line says why and
        this call and every later one run eagerly."""
        shape = (rows, targets, keys)
        if not (self.compiled or self.cuda_graphs):  # eager: not even importing dynamo
            return self.strategy.step(*shape)
        new = shape not in self.prepared_shapes
        start = time.perf_counter()
        try:
            outputs = self._run_fast(shape)
        except Exception as err:  # inductor, Triton, dynamo's recompile limit, a failed capture
            if not new and not self.compiled:
                raise  # a replay that failed: not a compiler's or a capture's failure
            self._fall_back(err)
            return self.strategy.step(*shape)
        if new:
            self.prepared_shapes.add(shape)
            self.setup_seconds += time.perf_counter() - start
        return outputs

    def _run_fast(self, shape: tuple[int, int, int]):
        run = self._replay if self.cuda_graphs else self._network_step
        if not self.compiled:
            return run(*shape)
        # a graph per call shape: raise dynamo's limit of recompilations of one function to the
        # number of shapes a plan can have (rows, targets: powers of two; keys: KEY_BLOCK steps)
        shapes = (self.seq_len.bit_length() + 1) ** 2 * (-(-self.seq_len // KEY_BLOCK))
        with torch._dynamo.config.patch(recompile_limit=max(8, shapes)):
            return run(*shape)

    def _fall_back(self, err: Exception) -> None:
        """Eager from now on, and in every later sampler of this process; one warning line."""
        paths = [name for name, on in (("compiling", self.compiled),
                                       ("capturing", self.cuda_graphs)) if on]
        if not FAILED_FAST_PATHS.issuperset(paths):
            cause = (str(err).strip().splitlines() or [""])[0][:200]
            print(f"warning: {' and '.join(paths)} the sampler's network call failed "
                  f"({type(err).__name__}: {cause}): sampling eagerly", file=sys.stderr,
                  flush=True)
        FAILED_FAST_PATHS.update(paths)
        self.compiled = self.cuda_graphs = False
        self._network_step = self.strategy.step

    def _replay(self, rows: int, targets: int, keys: int):
        shape = (rows, targets, keys)
        if shape not in self._graphs:
            self._graphs[shape] = self._capture(shape)
        return self._graphs[shape]()

    def _capture(self, shape: tuple[int, int, int]) -> Callable[[], tuple]:
        """What replays one call of this shape: a CUDA graph of the step, captured after a
        warm-up run (which sets up cuBLAS and attention workspaces, and compiles) whose changes
        to the sampler's state are undone, so that the replay makes the call."""
        saved = self._snapshot()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._network_step(*shape)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._restore(saved)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = self._network_step(*shape)

        def replay() -> tuple:
            graph.replay()
            return outputs

        return replay

    def _written(self) -> list[torch.Tensor]:
        """What a call changes besides the cache (whose writes a replay repeats): the engine
        tensors the strategy declares it writes, and its own state."""
        engine = [getattr(self, name) for name in sorted(self.strategy.writes - {"cache"})]
        return [*engine, *self.strategy.state()]

    def _snapshot(self) -> list[torch.Tensor]:
        return [tensor.clone() for tensor in self._written()]

    def _restore(self, saved: list[torch.Tensor]) -> None:
        for tensor, copy in zip(self._written(), saved, strict=True):
            tensor.copy_(copy)

    # ---- the AdaLN tables follow the weights -------------------------------------------------

    def _weights_version(self) -> int:
        """Changes whenever a weight the AdaLN tables are made of is changed in place (a host
        counter: reading it waits for nothing). Weights made under torch.inference_mode keep no
        counter: they count as unchanged."""
        return sum(0 if p.is_inference() else p._version
                   for name, p in self.model.named_parameters()
                   if "adaLN" in name or "wtpe" in name)

    def _refresh_tables(self) -> None:
        """Rebuilds the AdaLN tables if the model's weights changed since (an optimizer step, a
        load_state_dict): into the same tensors, which captured CUDA graphs read."""
        version = self._weights_version()
        if version == self._tables_version:
            return
        with torch.no_grad():
            for table, fresh in zip(self.adaln_tables, self.model.adaln_tables()[0], strict=True):
                if table is not None:
                    table.copy_(fresh)
        self._tables_version = self._weights_version()
