"""What a generation returns (Generation; LongGeneration past the block, model/sampler/window.py)
and the JSON record of each sample that trainer/sample.py --out and the samples drawn while
training write (sample_records). What each network call shows a caller (on_step's StepOutput) is
strategy.py's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from aogpt.model.sampler.config import SamplingConfig
from aogpt.model.sampler.ways import STEPS, way_of


@dataclass
class Generation:
    tokens: torch.Tensor  # (b, n) int64, at their original positions
    orders: torch.Tensor  # (b, n) int64, the order each sample was generated in
    network_calls: int  # calls the batch made
    rows: int  # token rows per sequence pushed through the network (padding included)
    # (b,) int64: the calls each sample needed (a batch runs until its last sample is done)
    sample_calls: torch.Tensor | None = None
    # speculative: (b,) int64 drafts verified and accepted per sample
    stats: dict[str, torch.Tensor] = field(default_factory=dict)
    # generate(record_calls=True): each sample's calls, what each did (recording.py)
    calls: list[list[dict]] | None = None


@dataclass
class LongGeneration:
    texts: list[list[int]]  # each sample's tokens, cut where it stopped
    orders: list[list[int]]  # the positions it generated, in the order it generated them
    network_calls: int  # calls of the batch, every chunk
    sample_calls: list[int]  # each sample's own calls (until it stopped)
    seams: list[int]  # the positions where each chunk after the first begins to generate
    stopped: list[str | None]  # why each sample stopped early (None: it reached the length)
    # each sample's generation stats summed over its chunks (a planner's log_likelihood, each
    # chunk's given its window; speculative drafts decided and accepted)
    stats: dict[str, list[float]]
    # record_calls: each sample's calls over its chunks, positions in the text (recording.py)
    calls: list[list[dict]] | None = None


def sample_records(sample_ids: list[int], out: Generation | LongGeneration, encoding,
                   config: SamplingConfig, **fields) -> list[dict]:
    """One JSON-ready record per sample of a generate() call, as --out writes them (and the
    trainer's samples while training), with `fields` added to each. A text made by the sliding
    window or cut by a stop rule (a LongGeneration) also carries its length, seams and why it
    stopped, and its order lists the positions generated, in the order generated. A generation
    made with record_calls carries each sample's calls (recording.py)."""
    if isinstance(out, LongGeneration):
        texts, orders, calls, stats = out.texts, out.orders, out.sample_calls, out.stats
        extra = [{"length": len(text), "seams": [p for p in out.seams if p < len(text)],
                  "stopped": stopped} for text, stopped in zip(texts, out.stopped, strict=True)]
    else:
        texts, orders, calls = out.tokens.tolist(), out.orders.tolist(), out.sample_calls.tolist()
        stats = {name: values.tolist() for name, values in out.stats.items()}
        extra = [{} for _ in texts]
    if out.calls is not None:
        extra = [{**fields_k, "calls": calls_k} for fields_k, calls_k in zip(extra, out.calls,
                                                                             strict=True)]
    settings = dataclasses.asdict(config)
    return [{"sample": i, "tokens": tokens, "text": encoding.decode(tokens), "order": order,
             **extra[k], "steps": config.steps if way_of(config).reads(STEPS) else None,
             "network_calls": sample_calls, "batch_network_calls": out.network_calls,
             **{name: values[k] for name, values in stats.items()}, "settings": settings,
             **fields}
            for k, (i, tokens, order, sample_calls) in enumerate(zip(
                sample_ids, texts, orders, calls, strict=True))]
