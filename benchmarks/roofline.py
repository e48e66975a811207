"""A named GPU's time for each kernel of a census (benchmarks/kernel_census.py), and the time of
the whole sequence with the host launching it: benchmarks/step_anatomy.py's prediction.

Every constant is a published peak or a public measurement, named where it is defined; none is
fitted to the measurements the prediction is checked against (docs/gpu-report.json). A kernel
takes the longer of its arithmetic and its memory traffic (the roofline), plus a fixed cost:

    matmul     FLOPs / (the GPU's maximum achievable matmul FLOP/s x wave efficiency of its
               shape), or its bytes / achievable bandwidth, whichever is longer
    attention  FLOPs / (FlashAttention-2's measured share of the peak), causal attention
               counting the half of the scores it computes
    the rest   bytes / achievable bandwidth (pointwise kernels and reductions: memory-bound)
    + KERNEL_S per kernel, the time a kernel that moves nothing takes on the device

A kernel outside a CUDA graph must also be launched by the host (HOST_LAUNCH_S each): the device
runs ahead while kernels are longer than launches and waits when they are shorter
(`sequence_seconds` simulates both clocks over two consecutive calls and takes the second, the
steady state). Inside a CUDA graph (the sampler's decode call) the host launches one graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernel_census import Kernel


@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float  # dense bf16 tensor-core FLOP/s (datasheet)
    bandwidth: float  # HBM bytes/s (datasheet)
    sms: int  # streaming multiprocessors
    matmul_flops: float  # maximum achievable bf16 matmul FLOP/s (measured)
    attention_share: float  # of peak_flops, FlashAttention-2 fwd + bwd (measured)
    tile: tuple[int, int]  # a large bf16 GEMM's output tile (M, N) per thread block


# Datasheets: H100 SXM 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 132 SMs; H200 the same die with
# 4.8 TB/s HBM3e; A100 SXM 80GB 312 TFLOP/s, 2.039 TB/s HBM2e, 108 SMs. Maximum achievable matmul
# FLOP/s: S. Bekman, "Machine Learning Engineering", accelerator chapter, MAMF table (best bf16
# shape, torch 2.7 / 2.6): H100 SXM 794.5 TFLOP/s ("H200 is the same"), A100 SXM 271.2.
# FlashAttention-2 on Hopper: 35% of the peak (FlashAttention-3, arXiv 2407.08608, abstract);
# on an A100 50-73% (FlashAttention-2, arXiv 2307.08691): the low end, our head dim 64 and 1K
# tokens being the small end of its sweep. Tiles: cuBLAS's bf16 kernels on sm90 use 128 x 256,
# on sm80 128 x 128 (NVIDIA, Matrix Multiplication Background User's Guide: tile and wave
# quantization).
GPUS = {
    "H100": GPU("H100 SXM", 989e12, 3.35e12, 132, 794.5e12, 0.35, (128, 256)),
    "H200": GPU("H200 SXM", 989e12, 4.8e12, 132, 794.5e12, 0.35, (128, 256)),
    "A100": GPU("A100 SXM 80GB", 312e12, 2.039e12, 108, 271.2e12, 0.50, (128, 128)),
}
# Share of the HBM peak a device-to-device copy reaches: 2,903 of 3,350 GB/s on H100 SXM (Voltage
# Park and Georgia Tech's H100 cluster benchmarks, "GPU D2D (HBM3)", 86.7%); taken for all three.
BANDWIDTH_SHARE = 0.867
# A kernel's fixed cost on the device: a 1024-element add replayed 2,000 times in one CUDA graph
# takes 1.1-1.3 us each (pytorch/pytorch#161104).
KERNEL_S = 1.2e-6
# The host's cost of launching one eager op: ~5 us for a one-element multiply without autograd
# in a Python loop (pytorch/pytorch#41383), taken for every kernel launched outside a graph.
HOST_LAUNCH_S = 5e-6
SPLIT_K_MIN = 512  # a K slice of a split-K GEMM is at least this long (see wave_efficiency)

CLASSES = ("matmul", "attention", "norm + AdaLN", "loss", "optimizer + EMA", "orders/gathers",
           "copies", "other")
COPY_OPS = {"_to_copy", "prims.convert_element_type", "clone", "copy_", "copy", "cat", "stack",
            "expand", "permute", "reshape", "view", "split", "unbind", "slice", "t", "transpose",
            "_unsafe_view", "squeeze", "unsqueeze", "constant_pad_nd", "zeros", "zero_",
            "fill_", "full", "full_like", "new_zeros", "scalar_tensor", "ones_like"}
NORM_OPS = {"rsqrt", "rms_norm", "_fused_rms_norm", "native_layer_norm", "layer_norm", "mean",
            "native_layer_norm_backward", "_fused_rms_norm_backward"}
AFFINE_OPS = {"add", "mul", "sub", "div", "sum", "neg", "add_", "mul_", "pow"}
GATHER_OPS = {"embedding", "embedding_dense_backward", "gather", "scatter", "scatter_",
              "index", "index_put", "index_put_", "index_select", "_unsafe_index",
              "_unsafe_masked_index_put_accumulate", "_unsafe_masked_index", "index_add_",
              "_unsafe_index_put"}
ATTENTION_WORDS = ("scaled_dot_product", "flash_attention", "efficient_attention", "flash_attn")


def op_names(kernel: Kernel) -> set[str]:
    """The kernel's ops without their overload ("mul.Tensor" -> "mul")."""
    return {op if op.startswith("prims.") and op.count(".") == 1 else op.split(".")[0]
            for op in (o.removesuffix(".default") for o in kernel.ops)}


def kernel_class(kernel: Kernel) -> str:
    """One of CLASSES: by what the kernel computes, then by what the step was doing."""
    attention = {op for op in op_names(kernel) if any(word in op for word in ATTENTION_WORDS)}
    ops = op_names(kernel) - attention  # a generated kernel around attention: what it does
    if kernel.matmul is not None:
        return "matmul"
    if attention and (kernel.extern or not kernel.compiled):
        return "attention"
    if kernel.phase in ("optimizer", "orders", "loss"):
        return {"optimizer": "optimizer + EMA", "orders": "orders/gathers"}.get(kernel.phase,
                                                                                "loss")
    if ops <= COPY_OPS:
        return "copies"
    if ops & NORM_OPS or ops <= AFFINE_OPS | COPY_OPS:
        return "norm + AdaLN"
    if ops & GATHER_OPS:
        return "orders/gathers"
    return "other"


def wave_efficiency(gpu: GPU, shape: tuple[int, int, int, int]) -> float:
    """The share of the SMs a matmul keeps busy over its waves of output tiles. A GEMM of fewer
    tiles than SMs (a weight gradient: M, N = the layer's, K = the tokens) is split along K
    into slices of at least SPLIT_K_MIN, as cuBLAS's split-K kernels do."""
    batch, m, n, k = shape
    tiles = batch * math.ceil(m / gpu.tile[0]) * math.ceil(n / gpu.tile[1])
    if tiles < gpu.sms:
        tiles *= max(1, min(gpu.sms // tiles, k // SPLIT_K_MIN))
    return tiles / (math.ceil(tiles / gpu.sms) * gpu.sms)


def roofline_seconds(kernel: Kernel, gpu: GPU, causal: bool) -> float:
    """The kernel's arithmetic or its memory traffic on `gpu`, whichever takes longer."""
    memory = kernel.bytes / (gpu.bandwidth * BANDWIDTH_SHARE)
    if kernel.matmul is not None:
        compute = kernel.flops / (gpu.matmul_flops * wave_efficiency(gpu, kernel.matmul))
    elif kernel_class(kernel) == "attention":
        done = kernel.flops / 2 if causal else kernel.flops  # causal kernels skip the masked half
        compute = done / (gpu.peak_flops * gpu.attention_share)
    else:
        compute = 0.0
    return max(compute, memory)


def launches(kernel: Kernel, gpu: GPU) -> int:
    """GPU kernels the kernel is: Triton splits a reduction of few outputs over many values in
    two kernels, the CPU's C++ kernels never do. Inductor's thresholds
    (ir.Reduction.num_splits, choices.reduction_split_factor): more than 8,192 values reduced
    per output, and fewer output blocks of 128 than SMs (a gradient's column sums over the
    tokens: split; a norm over 768 features: not)."""
    if kernel.reduction is None:
        return 1
    outputs, reduced = kernel.reduction
    return 2 if reduced > 8192 and outputs < 128 * gpu.sms else 1


def kernel_seconds(kernel: Kernel, gpu: GPU, causal: bool) -> float:
    """The device's time for the kernel: its roofline plus each launch's fixed cost."""
    return roofline_seconds(kernel, gpu, causal) + KERNEL_S * launches(kernel, gpu)


def sequence_seconds(kernels: list[Kernel], gpu: GPU, causal: bool, in_graph: bool) -> float:
    """The device's time for the kernels in order, launched one by one by the host (or replayed
    as one CUDA graph): the second of two back-to-back runs, when the host may already be
    ahead."""
    host = device = 0.0
    ends = []
    for _ in range(2):
        for kernel in kernels:
            count = launches(kernel, gpu)
            seconds = kernel_seconds(kernel, gpu, causal) / count
            for _ in range(count):
                host += 0.0 if in_graph else HOST_LAUNCH_S
                device = max(device, host) + seconds
        ends.append(device)
    return ends[1] - ends[0]


# What a GPU profile's kernel names say of their class (the census's classes, for the profiler's
# measured time beside the prediction): library kernels by their vendors' names, inductor's
# Triton kernels by the ops their names list (triton_per_fused_add_mean_mul_pow_rsqrt_0). cuBLAS
# 12.8 and later names most of its Hopper and Blackwell GEMMs nvjet_* (nvjet_tst_128x256_...);
# cuDNN's flash backward opens with a rowwise dot of dO and O (cudnn::fusion::compute_dot_do_o)
LIBRARY_KERNELS = (("attention", ("flash", "fmha", "attention", "attn", "dot_do_o")),
                   ("matmul", ("gemm", "xmma", "cutlass", "cublas", "splitkreduce", "wgmma",
                               "nvjet")),
                   ("optimizer + EMA", ("multi_tensor_apply", "adam", "lerp")),
                   ("orders/gathers", ("index", "gather", "scatter", "embedding", "sort", "radix")),
                   ("copies", ("memcpy", "memset", "copy", "cat", "fill")),
                   # eager adds, products and sums (autograd adding a micro-step's gradient into
                   # the one held, a bias's gradient): the census classes a pure add, mul or
                   # sum as norm + AdaLN (AFFINE_OPS), so the GPU's must go there too
                   ("norm + AdaLN", ("cudafunctor_add", "mulfunctor", "sum_functor")))
LOSS_OPS = {"logsumexp", "exp"}
NAMED_OPS = COPY_OPS | NORM_OPS | AFFINE_OPS | GATHER_OPS | LOSS_OPS | {
    "gelu", "gelu_backward", "erf", "softmax", "_softmax", "where", "bitwise_xor", "rshift"}


def gpu_kernel_class(name: str, phase: str = "") -> str:
    """The class of a kernel a GPU profile names (see LIBRARY_KERNELS)."""
    lower = name.lower()
    if lower.startswith("triton_"):
        listed = f"_{lower.split('fused', 1)[-1]}_"
        ops = {op for op in NAMED_OPS if f"_{op}_" in listed}
        known = Kernel(name, phase, True, 0.0, 0.0, tuple(ops))
        return "loss" if ops & LOSS_OPS else kernel_class(known)
    if phase == "optimizer":
        return "optimizer + EMA"
    return next((cls for cls, words in LIBRARY_KERNELS if any(w in lower for w in words)),
                "other")


TOP_KERNELS = 6  # the costliest kernel names kept per class of a profile


def measured_classes(events, runs: int) -> dict[str, dict]:
    """Per class, the GPU kernels and their seconds per run in a torch.profiler's events of
    `runs` runs (copies and memsets between host and device left out), and its TOP_KERNELS
    costliest kernel names (`top`: name, kernels and seconds per run), which say what a class
    the anatomy does not predict is made of."""
    from torch.autograd import DeviceType

    table = {name: {"kernels": 0, "measured_s": 0.0} for name in CLASSES}
    names: dict[str, dict[str, list]] = {name: {} for name in CLASSES}
    for event in events:
        if event.device_type != DeviceType.CUDA or event.name.startswith(
                ("Memcpy", "Memset", "[memory]")):
            continue
        cls = gpu_kernel_class(event.name)
        seconds = event.time_range.elapsed_us() * 1e-6
        table[cls]["kernels"] += 1
        table[cls]["measured_s"] += seconds
        count = names[cls].setdefault(event.name[:120], [0, 0.0])
        count[0] += 1
        count[1] += seconds
    return {name: {"kernels": row["kernels"] / runs, "measured_s": row["measured_s"] / runs,
                   "top": [[kernel, n / runs, s / runs] for kernel, (n, s) in
                           sorted(names[name].items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]]}
            for name, row in table.items()}
