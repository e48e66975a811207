"""Which dtype a model runs in when the user says "auto": bf16 only where it is fast.

GPUs run bf16 natively. CPUs do only with AVX512-BF16 or AMX-BF16 instructions; on the others
(AVX2-only x86, for one) torch emulates bf16 matmuls, about 50x slower than fp32.
"""

from __future__ import annotations

import os

import torch

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


def auto_dtype(device: torch.device, cpuinfo: str | os.PathLike = CPUINFO) -> torch.dtype:
    """bf16 on a GPU and on a CPU with native bf16, else fp32."""
    if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16(cpuinfo)):
        return torch.bfloat16
    return torch.float32
