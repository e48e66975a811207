"""Where and in which dtype a model runs when the user says "auto": every command's --device,
--dtype and training's train.precision "auto" are decided here.

The device: the GPU when there is one. The dtype, by what the numbers are for:

    auto_dtype          the fastest: bf16 on a GPU and on a CPU with native bf16, else fp32;
                        for measurements of speed (benchmarks)
    reproducible_dtype  bf16 on a GPU, fp32 on every CPU; for runs whose numbers are compared
                        with other machines' (training, trainer/sample.py)

GPUs run bf16 natively. CPUs do only with AVX512-BF16 or AMX-BF16 instructions; on the others
(AVX2-only x86, for one) torch emulates bf16 matmuls, about 50x slower than fp32.
"""

from __future__ import annotations

import os
import platform

import torch

from aogpt import UsageError

CPUINFO = "/proc/cpuinfo"
NATIVE_BF16_FLAGS = {"avx512_bf16", "amx_bf16"}  # Linux's names for AVX512-BF16 and AMX-BF16


def cpu_has_native_bf16(cpuinfo: str | os.PathLike = CPUINFO) -> bool:
    """True when the CPU flags in `cpuinfo` (Linux's /proc/cpuinfo) include a bf16 instruction
    set; False when they do not, or cannot be read (another OS)."""
    try:
        with open(cpuinfo) as lines:
            for line in lines:
                name, _, value = line.partition(":")
                if name.strip() == "flags":  # the same on every processor: the first one tells
                    return not NATIVE_BF16_FLAGS.isdisjoint(value.split())
    except OSError:
        pass
    return False


def device_name(device: torch.device, cpuinfo: str | os.PathLike = CPUINFO) -> str:
    """What a measurement ran on, for its record: the GPU's name, or the CPU's model name and the
    threads torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open(cpuinfo) as lines:
            model = next((line.partition(":")[2].strip() for line in lines
                          if line.startswith("model name")), model)
    except OSError:
        pass
    threads = torch.get_num_threads()
    return f"{model}, {threads} thread{'s' if threads > 1 else ''}"


def auto_dtype(device: torch.device, cpuinfo: str | os.PathLike = CPUINFO) -> torch.dtype:
    """The fastest dtype: bf16 on a GPU and on a CPU with native bf16, else fp32."""
    if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16(cpuinfo)):
        return torch.bfloat16
    return torch.float32


def reproducible_dtype(device: torch.device) -> torch.dtype:
    """bf16 on a GPU, fp32 on every CPU, native bf16 or not.

    Unlike auto_dtype it reads no CPU flags: a CPU run (the demo, the tests, a config tried on a
    laptop) checks a recipe rather than racing, and its numbers are compared with ones made on
    other CPUs (the demo's in README.md came from an AVX2-only machine; trainer/sample.py
    redraws the samples that training wrote, token for token), so its arithmetic must not
    depend on which CPU runs it.
    """
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def training_precision(device: torch.device) -> str:
    """train.precision's "auto": bf16 matmuls under autocast over fp32 weights (autocast_bf16,
    how the paper trained) where reproducible_dtype is bf16, else fp32."""
    return "autocast_bf16" if reproducible_dtype(device) == torch.bfloat16 else "fp32"


def resolve_device(name: str, own: torch.device | None = None,
                   setting: str = "--device") -> torch.device:
    """The device a command's `setting` (its --device flag, lm-eval's device=) names. "auto":
    `own` (the process's device under a launcher, DistEnv.device) if given, else the GPU when
    there is one, else the CPU. A bare "cuda" is `own`'s GPU when it has one (each process its
    own), else the first."""
    if name == "auto":
        if own is not None:
            return own
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"{_given(setting, name)} is not a device: use auto, cpu, cuda or "
                         "cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"{_given(setting, name)}: no CUDA GPU is visible here; use "
                         f"{_given(setting, 'cpu')}")
    if device.type == "cuda" and device.index is None and own is not None and own.type == "cuda":
        return own
    return device


def _given(setting: str, value: str) -> str:
    """How the user wrote it: "--device cuda" for a flag, "device=cuda" for lm-eval's model args."""
    return f"{setting}{value}" if setting.endswith("=") else f"{setting} {value}"
