"""Tokens given before generation starts: a prompt and infill, as token ids at their positions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from aogpt import UsageError
from aogpt.model.config import GPT2_VOCAB


def given_tokens(seq_len: int, prompt: str | Sequence[int] | torch.Tensor | None = None,
                 infill: Mapping[int | str, str | Sequence[int] | torch.Tensor] | None = None,
                 encoding=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(seq_len,) tokens and mask of the given positions, as generate() takes them (expanded to
    (b, seq_len)): the prompt from position 0, then each infill value from its start position,
    e.g. {40: " the river", "60": [13, 383]}; each is text or token ids (a list or a tensor). A
    key may be a string, as in a JSON object.

    encoding turns text into GPT-2 ids, so text needs one: tiktoken's
    (aogpt.data_prep.tokenizer.load_gpt2), whose encode_ordinary reads "<|endoftext|>" as plain
    text, or any tokenizer with encode(text). Bad input is a UsageError that names positions, not
    flags: a command says which of its flags gave them.
    """
    pieces = [] if prompt is None else [(0, prompt)]
    pieces += list((infill or {}).items())
    tokens = torch.zeros(seq_len, dtype=torch.long)
    mask = torch.zeros(seq_len, dtype=torch.bool)
    for key, piece in pieces:
        try:
            start = int(key)
        except ValueError as err:
            raise UsageError(f"infill key {key!r} is not a token position") from err
        ids = _token_ids(start, piece, encoding)
        end = start + len(ids)
        if start < 0 or end > seq_len:
            raise UsageError(f"given text at {start}..{end - 1} does not fit in a sequence of "
                             f"{seq_len} tokens")
        if mask[start:end].any():
            raise UsageError(f"given text at {start}..{end - 1} overlaps other given text")
        tokens[start:end] = ids
        mask[start:end] = True
    return tokens, mask


def _token_ids(start: int, piece, encoding) -> torch.Tensor:
    """The GPT-2 ids (n,) int64 of one given piece: text through `encoding`, or ids as they are."""
    if isinstance(piece, str):
        if encoding is None:
            raise UsageError(f"given text at {start} needs a tokenizer: pass encoding, or give "
                             "token ids")
        # tiktoken's encode refuses special tokens in text: prefer its encode_ordinary when present
        encode = getattr(encoding, "encode_ordinary", None) or encoding.encode
        return torch.tensor(encode(piece), dtype=torch.long)
    try:
        ids = torch.as_tensor(piece)
    except (TypeError, ValueError, RuntimeError):  # what as_tensor raises for other than numbers
        ids = None
    # a list of ids, or a tensor of them (flattened: a tokenizer's (1, n) too); an empty list
    # reads as float32
    if ids is None or ids.dim() == 0 or (ids.numel()
                                         and (ids.is_floating_point() or ids.is_complex())):
        raise UsageError(f"given tokens at {start}: give a string or a list of token ids")
    ids = ids.flatten().long().cpu()
    if len(ids) and not 0 <= int(ids.min()) <= int(ids.max()) < GPT2_VOCAB:
        raise UsageError(f"given tokens at {start}: token ids must be in 0..{GPT2_VOCAB - 1}")
    return ids
