"""The model a sampler benchmark samples (benchmarks/sampler_pareto.py, long_generation.py): a
checkpoint's weights loaded as trainer/sample.py loads them, with the provenance the benchmark's
outputs record; and one batch's generation timed (sampler_pareto.py, sampling_race.py)."""

from __future__ import annotations

import argparse
import time

import torch

from aogpt.model import load_checkpoint
from aogpt.model.checkpoint import locate_checkpoint, provenance
from aogpt.model.precision import reproducible_dtype, resolve_device
from aogpt.model.sampler import Generation, KVCacheSampler


def sampling_model(args: argparse.Namespace, made_by: str) -> tuple:
    """(model, device, provenance) for a sampler benchmark: --ckpt's --weights on --device, in
    the dtype sample.py samples in, with the provenance its outputs record."""
    device = resolve_device(args.device)
    source = locate_checkpoint(args.ckpt)
    model = load_checkpoint(source.file, weights=args.weights, map_location=device)
    model = model.to(reproducible_dtype(device)).eval()
    return model, device, provenance(source, args.weights, vars(args), made_by=made_by)


def timed(sampler: KVCacheSampler, ids: torch.Tensor, device: torch.device
                     ) -> tuple[Generation, float]:
    """(generation, seconds) of one batch, the device's queue waited for."""
    start = time.perf_counter()
    out = sampler.generate(ids)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start
