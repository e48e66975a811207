"""The paper's context-order ensemble (Finding 5), as mathematics over one model: for the i-th
target of a base order σ, p_ens = mean over M members of p(x[σ_i] | the context σ_<i
re-permuted), member 0 being σ itself. trainer/evaluation.py scores data folders with it
(evaluate.py --ensemble; evaluation while training scores no ensemble) and
trainer/lm_harness.py answers lm-eval's requests with it (order=ensemble:M): both call
ensemble_member_nll, the one member loop.

The ensemble, cheaply. The paper's script runs, per batch of 4 sequences of n = 1024 tokens,
1 + n (M-1) full forwards of n+1 slots with all logits. Causal attention makes the prediction of
target i depend only on slots 0..i, so member j of target i is a forward over its i+1 slots with
the head on the last slot only: about n^2 (M-1) / 2 slot-forwards per sequence instead of
n^2 (M-1), and n (M-1) head rows instead of n^2 (M-1). The members of many targets are packed
into forwards of batch_size x n slots, longest first, right-padded (causal attention hides the
padding). Member 0 comes from the base order's one full forward. With ensemble_targets = N, N
targets per sequence are drawn uniformly without replacement and each stands for n/N targets of
its sequence: an unbiased estimate of the mean NLL, with the standard error of that sampling
(stratified by sequence, given the drawn orders).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from aogpt.model import AOGPT
from aogpt.model.orders import Stream, counter_uniform


def member_orders(base_orders: torch.Tensor, sample_indices: torch.Tensor, targets: torch.Tensor,
                  members: torch.Tensor, seed: int, length: int) -> torch.Tensor:
    """The ensemble members' orders, one per row, cut after `length` entries: (R, length).

    Row r is member members[r] of the targets[r]-th target of the base order base_orders[r]
    (R, n): the context (the first targets[r] entries) uniformly re-permuted, the target and
    everything after it kept. Member 0 is the base order itself. The permutation depends only on
    (seed, sample, target, member), so a cut prefix is the prefix of the full order.
    """
    positions = torch.arange(length, device=base_orders.device)
    keys = counter_uniform(seed, Stream.ENSEMBLE_MEMBERS, sample_indices[:, None],
                           targets[:, None], members[:, None], positions)  # (R, length) in [0, 1)
    keys = torch.where(members[:, None] == 0, positions.double() / length, keys)
    keys = torch.where(positions >= targets[:, None], 2.0 + positions.double(), keys)
    return base_orders[:, :length].gather(1, torch.argsort(keys, dim=1, stable=True))


def choose_targets(seed: int, sample_indices: torch.Tensor, lengths: torch.Tensor,
                   per_sequence: int | None, seq_len: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The targets (indices into the base order) the ensemble scores: all real ones, or
    `per_sequence` of them per sample, uniformly without replacement.

    Returns unit_sample (U,) (the row of the batch), unit_target (U,), and counts (b,).
    """
    positions = torch.arange(seq_len, device=lengths.device)
    counts = lengths if per_sequence is None else lengths.clamp(max=per_sequence)
    keys = counter_uniform(seed, Stream.ENSEMBLE_TARGETS, sample_indices[:, None],
                           positions)  # (b, n)
    ranked = torch.argsort(torch.where(positions < lengths[:, None], keys, 2.0), dim=1, stable=True)
    unit_sample, rank = torch.nonzero(positions < counts[:, None], as_tuple=True)
    return unit_sample, ranked[unit_sample, rank], counts



def last_slot_hidden(model: AOGPT, idx: torch.Tensor, orders: torch.Tensor,
                     targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The final hidden state of the slot that predicts the targets[r]-th token of orders[r]
    given the ones before it, (R, d), and that token's id, (R,).

    idx (R, n) token ids; orders (R, L) may be cut anywhere after the row's target: causal
    attention hides the slots after it.
    """
    rows = torch.arange(len(idx), device=idx.device)
    tokens = idx.gather(1, orders)  # (R, L) in order
    hidden = model.forward_stream(*model.slots(tokens, orders))  # (R, L, d)
    return hidden[rows, targets], tokens[rows, targets]


def last_slot_nll(model: AOGPT, idx: torch.Tensor, orders: torch.Tensor,
                  targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-log p of the targets[r]-th token of orders[r] given the ones before it, (R,) fp32, and
    the hidden state it came from, (R, d) (see last_slot_hidden). Only the target's slot reaches
    the output head."""
    hidden, tokens = last_slot_hidden(model, idx, orders, targets)
    return model.lm_head(hidden, tokens, model.config.loss_chunk_size), hidden


def longest_first_chunks(lengths: torch.Tensor, slots_per_forward: int
                         ) -> Iterator[tuple[torch.Tensor, int]]:
    """Rows of `lengths` slots, longest first, packed into forwards of at most slots_per_forward
    slots (at least one row each): (the chunk's row indices, its longest length) per forward."""
    order = torch.argsort(lengths, descending=True, stable=True)
    sorted_lengths = lengths[order].tolist()
    start = 0
    while start < len(sorted_lengths):
        length = sorted_lengths[start]
        stop = min(start + max(1, slots_per_forward // length), len(sorted_lengths))
        yield order[start:stop], length
        start = stop


def ensemble_member_nll(model: AOGPT, idx: torch.Tensor, base_orders: torch.Tensor,
                        unit_keys: torch.Tensor, unit_sample: torch.Tensor,
                        unit_target: torch.Tensor, members: int, seed: int,
                        slots_per_forward: int,
                        each_hidden: Callable[[torch.Tensor, torch.Tensor], None] | None = None
                        ) -> tuple[torch.Tensor, int, int]:
    """-log p of each unit's target under members 1..members-1: (U, members-1), and the cost
    (forwards, slot-forwards). The one member loop of every ensemble (evaluate.py's, lm-eval's).

    A unit is one target of one sequence: unit_sample (U,) its row of idx (b, n), unit_target
    (U,) the target's index in that row's base order (base_orders (b, n)), unit_keys (U,) what
    its members' permutations are drawn from (member_orders: the sample's index in its dataset,
    or a key of its context). The rows of all (unit, member) pairs are packed longest first into
    forwards of at most slots_per_forward slots (at least one row each); only each row's target
    slot reaches the output head. each_hidden(units, hidden), when given, sees every forward's
    final hidden states of those slots (R, d) with their units (R,), a unit appearing once per
    member (lm-eval's greedy check over the mixture)."""
    nll = torch.empty(len(unit_target), members - 1, dtype=torch.float64, device=idx.device)
    row_unit = torch.arange(len(unit_target), device=idx.device).repeat_interleave(members - 1)
    row_member = torch.arange(1, members, device=idx.device).repeat(len(unit_target))
    forwards = slot_forwards = 0
    for chunk, length in longest_first_chunks(unit_target[row_unit] + 1, slots_per_forward):
        unit, member = row_unit[chunk], row_member[chunk]
        sample = unit_sample[unit]
        orders = member_orders(base_orders[sample], unit_keys[unit], unit_target[unit], member,
                               seed, length)
        row_nll, hidden = last_slot_nll(model, idx[sample], orders, unit_target[unit])
        nll[unit, member - 1] = row_nll.double()
        if each_hidden is not None:
            each_hidden(unit, hidden)
        forwards, slot_forwards = forwards + len(chunk), slot_forwards + len(chunk) * length
    return nll, forwards, slot_forwards


def straightforward_member_nll(model: AOGPT, idx: torch.Tensor, base_orders: torch.Tensor,
                               sample_indices: torch.Tensor, target: int, member: int,
                               seed: int) -> torch.Tensor:
    """The paper's way, kept as the reference and the benchmark's baseline: one full forward
    over the batch in member `member`'s order of target `target`, the logits of every slot made
    (in chunks), of which only that target's NLL is kept. (b,)"""
    b, n = idx.shape
    full = torch.full((b,), target, device=idx.device)
    orders = member_orders(base_orders, sample_indices, full, torch.full_like(full, member),
                           seed, n)
    return model(idx, orders)[:, target].double()


def mixture_nll(member_nll: torch.Tensor) -> torch.Tensor:
    """-log p_ens of each unit's target, p_ens being the mean of its members' probabilities:
    (U, M) member NLLs -> (U,)."""
    return math.log(member_nll.shape[1]) - torch.logsumexp(-member_nll, dim=1)


def ensemble_sums(unit_nll: torch.Tensor, unit_sample: torch.Tensor, counts: torch.Tensor,
                  lengths: torch.Tensor, sizes: tuple[int, ...]) -> torch.Tensor:
    """Per ensemble size M': the estimated sum of -log p_ens over all real targets, and the
    variance of that estimate: (len(sizes), 2) float64.

    unit_nll (U, M): member 0 first. A sample b with N_b of its L_b targets scored weighs each
    by L_b / N_b; the variance is that of stratified sampling without replacement,
    sum_b L_b^2 (1 - N_b / L_b) s_b^2 / N_b (NaN when some N_b = 1 < L_b: not estimable).
    """
    counts, lengths = counts.double(), lengths.double()
    weights = (lengths / counts)[unit_sample]
    out = []
    for m in sizes:
        nll = mixture_nll(unit_nll[:, :m])
        total = (weights * nll).sum()
        sums = counts.new_zeros(len(counts)).index_add_(0, unit_sample, nll)
        squares = counts.new_zeros(len(counts)).index_add_(0, unit_sample, nll * nll)
        spread = ((squares - sums**2 / counts) / (counts - 1)).clamp(min=0)  # s_b^2, (b,)
        sampled = counts < lengths
        variance = torch.where(sampled, lengths**2 * (1 - counts / lengths) * spread / counts, 0.0)
        out.append(torch.stack([total, variance.sum()]))
    return torch.stack(out)
