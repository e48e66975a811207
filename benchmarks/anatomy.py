"""What benchmarks/step_anatomy.py makes of the kernels it recorded: a full-size step from two
small ones, a GPU's time for each kernel and class, the validation against the measured GPU
report, the JSON and the table.

A training step is recorded on a CPU at micro-batches of 2 and 3 sequences (a full one would
take minutes and gigabytes there; at 1, inductor specializes the dimensions of size one and
fuses otherwise). Every tensor of a step is either per token (activations, logits, orders:
proportional to the micro-batch) or per weight (constant), so each kernel's FLOPs and bytes are
a line in the micro-batch, read at the one asked for; the two recordings must list the same
kernels in the same order, or nothing is extrapolated. The loss's chunks are scaled with the
micro-batch, so that both run the full size's number of chunks.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

from kernel_census import Kernel
from roofline import (
    CLASSES,
    GPU,
    KERNEL_S,
    kernel_class,
    kernel_seconds,
    launches,
    sequence_seconds,
)

REPO = Path(__file__).resolve().parent.parent
GPU_REPORT = REPO / "docs" / "gpu-report.json"
RECORDED_MICRO_STEPS = 3  # first, middle and last micro-step of an optimizer step
RECORDED_MICRO_BATCHES = (2, 3)  # sequences per micro-batch of the two recordings


# Where the recording's kernels are a CPU's and not a GPU's (benchmarks/anatomy_record.py says
# where it takes the GPU's path instead), in the JSON for whoever reads its numbers
CPU_VS_GPU = [
    "matmuls are library calls on both (inductor keeps mm/addmm/bmm extern without max-autotune)",
    "attention is one library call each way on both: the CPU's flash attention where a GPU runs "
    "FlashAttention-2 (torch's SDPA) or the efficient kernel (a masked decode call); a GPU's "
    "backward launches 2-3 kernels (counted as one)",
    "inductor's scheduler fuses alike (the same pass before code generation), but Triton splits "
    "a reduction of few outputs over many values in two kernels (roofline.launches adds them) "
    "where a CPU's C++ kernel does not, and a CPU puts several fused nodes in one C++ function "
    "(counted apart, as a GPU's kernels)",
    "the chunked loss runs the preset's chunks (a CPU's are cache-sized) and the head's weight "
    "gradient is one fp32-accumulating matmul (a CPU makes three kernels of it)",
    "autocast follows the CPU's op lists: matmuls and attention in bf16 as CUDA's; eager ops a "
    "GPU runs as several kernels (fused AdamW's multi-tensor launches) count as one",
    "a host-to-device copy of each batch is not recorded (a CPU has none)",
]


def to_json(kernels: list[Kernel]) -> list[dict]:
    return [asdict(k) for k in kernels]


def from_json(rows: list[dict]) -> list[Kernel]:
    def kernel(row: dict) -> Kernel:
        row = {**row, "ops": tuple(row["ops"])}
        for key in ("reduction", "matmul"):
            row[key] = tuple(row[key]) if row[key] is not None else None
        return Kernel(**row)

    return [kernel(row) for row in rows]


def _line(one, two, at: int):
    """The value at micro-batch `at` of a quantity that is `one` and `two` at the recorded
    micro-batches (RECORDED_MICRO_BATCHES)."""
    if one is None:
        return None
    if isinstance(one, tuple):
        return tuple(_line(a, b, at) for a, b in zip(one, two, strict=True))
    low, high = RECORDED_MICRO_BATCHES
    value = one + (two - one) * (at - low) / (high - low)
    return round(value) if isinstance(one, int) else value


def extrapolate(one: list[Kernel], two: list[Kernel], micro: int) -> list[Kernel]:
    """The kernels of a step at micro-batch `micro` from its two recordings, each kernel paired
    with its namesake (pair_kernels)."""
    return [replace(a, flops=_line(a.flops, b.flops, micro), bytes=_line(a.bytes, b.bytes, micro),
                    reduction=_line(a.reduction, b.reduction, micro),
                    matmul=_line(a.matmul, b.matmul, micro)) for a, b in pair_kernels(one, two)]


def pair_kernels(one: list[Kernel], two: list[Kernel]) -> list[tuple[Kernel, Kernel]]:
    """Each kernel of `one` with the same kernel of `two`: in order, and where inductor ordered
    a part of the step otherwise at the other size, the n-th kernel of a name with the n-th of
    that name within the same part (phase and micro-step). Two recordings that do not hold the
    same kernels in each part are refused."""
    parts_one, parts_two = _parts(one), _parts(two)
    if [p for p, _ in parts_one] != [p for p, _ in parts_two] or any(
            sorted(k.name for k in a) != sorted(k.name for k in b)
            for (_, a), (_, b) in zip(parts_one, parts_two, strict=True)):
        raise RuntimeError(f"the step's kernels differ between its two recordings ({len(one)} "
                           f"and {len(two)} kernels): nothing to extrapolate")
    pairs = []
    for (_, a), (_, b) in zip(parts_one, parts_two, strict=True):
        seen: dict[str, list[Kernel]] = {}
        for kernel in b:
            seen.setdefault(kernel.name, []).append(kernel)
        pairs += [(kernel, seen[kernel.name].pop(0)) for kernel in a]
    return pairs


def _parts(kernels: list[Kernel]) -> list[tuple[tuple[str, int], list[Kernel]]]:
    """The kernels in runs of the same (phase, micro-step)."""
    parts: list[tuple[tuple[str, int], list[Kernel]]] = []
    for kernel in kernels:
        if not parts or parts[-1][0] != (kernel.phase, kernel.micro):
            parts.append(((kernel.phase, kernel.micro), []))
        parts[-1][1].append(kernel)
    return parts


def optimizer_step(kernels: list[Kernel], accumulation: int) -> list[Kernel]:
    """The kernels of an optimizer step of `accumulation` micro-steps, in order, from a recorded
    step of three (the middle one stands for every micro-step between the first and the last);
    the step's own work (micro -1) once."""
    first, middle, last = ([k for k in kernels if k.micro == m]
                           for m in range(RECORDED_MICRO_STEPS))
    return first + middle * (accumulation - 2) + last + [k for k in kernels if k.micro < 0]


def matmul_attention_flops(kernels: list[Kernel]) -> float:
    return sum(k.flops for k in kernels if kernel_class(k) in ("matmul", "attention"))


def classes(kernels: list[Kernel], gpu: GPU, causal: bool) -> dict[str, dict]:
    """Per class: GPU kernels, FLOPs, bytes and predicted seconds (each kernel's own, without
    waiting for the host)."""
    table = {name: {"kernels": 0, "flops": 0.0, "bytes": 0.0, "predicted_s": 0.0}
             for name in CLASSES}
    for k in kernels:
        row = table[kernel_class(k)]
        row["kernels"] += launches(k, gpu)
        row["flops"] += k.flops
        row["bytes"] += k.bytes
        row["predicted_s"] += kernel_seconds(k, gpu, causal)
    total = sum(row["predicted_s"] for row in table.values()) or 1.0
    for row in table.values():  # what the class loses against its FLOPs at the peak
        row["lost_s"] = row["predicted_s"] - row["flops"] / gpu.peak_flops
        # as tables write them (docs/performance.md quotes these)
        row.update(gflop=row["flops"] / 1e9, gb=row["bytes"] / 1e9,
                   predicted_ms=row["predicted_s"] * 1e3, lost_ms=row["lost_s"] * 1e3,
                   share=row["predicted_s"] / total)
    return table


def distinct_kernels(kernels: list[Kernel], gpu: GPU, causal: bool) -> list[dict]:
    """Each distinct kernel of the step once (the 12 blocks' are the same kernels), with how many
    times it runs and its predicted seconds over all of them, slowest first."""
    key = lambda k: (k.name, k.phase, k.flops, k.bytes)  # noqa: E731
    runs = Counter(map(key, kernels))
    first = {key(k): k for k in reversed(kernels)}
    rows = [{"name": k.name, "class": kernel_class(k), "phase": k.phase, "runs": runs[key(k)],
             "launches": launches(k, gpu) * runs[key(k)], "flops": k.flops, "bytes": k.bytes,
             "ops": list(k.ops), "predicted_s": kernel_seconds(k, gpu, causal) * runs[key(k)]}
            for k in first.values()]
    return sorted(rows, key=lambda row: -row["predicted_s"])


def prediction(kernels: list[Kernel], gpu: GPU, causal: bool, in_graph: bool) -> dict:
    """The JSON's prediction for the kernels of one step or call."""
    table = classes(kernels, gpu, causal)
    seconds = sequence_seconds(kernels, gpu, causal, in_graph)
    device = sum(row["predicted_s"] for row in table.values())
    return {"gpu": gpu.name, "predicted_s": seconds, "device_s": device,
            "host_bound_s": seconds - device, "kernels_per_step": sum(
                row["kernels"] for row in table.values()),
            "launch_s_in_graph" if in_graph else "launch_s": KERNEL_S,
            "most_lost": max(table, key=lambda name: table[name]["lost_s"]),
            "cpu_vs_gpu": CPU_VS_GPU,
            "classes": table, "kernels": distinct_kernels(kernels, gpu, causal)}


def measured_training(configuration: dict) -> dict | None:
    """The GPU report's row of this training configuration, if it measured one."""
    report = json.loads(GPU_REPORT.read_text()) if GPU_REPORT.is_file() else {}
    keys = ("preset", "zero", "precision", "scope", "micro")
    for row in report.get("train", []):
        if all(row.get(key) == configuration.get(key) for key in keys) and "mfu" in row:
            return {"mfu": row["mfu"], "step_s": row["step_s"],
                    "source": f"docs/gpu-report.json ({report['environment']['device']}, torch "
                              f"{report['environment']['torch']}, {report['environment']['date']})"}
    return None


def measured_decode(configuration: dict) -> dict | None:
    """The GPU report's compiled + CUDA graphs decode call, if it measured this one."""
    report = json.loads(GPU_REPORT.read_text()) if GPU_REPORT.is_file() else {}
    decode = report.get("decode", {})
    if any(decode.get(key) != configuration[key] for key in
           ("preset", "batch_size", "seq_len", "known", "targets")):
        return None
    row = next((r for r in decode.get("results", []) if r["compiled"] and r["cuda_graphs"]), None)
    return None if row is None else {
        "call_ms": row["step_ms"], "kernels": row["kernels"],
        "source": f"docs/gpu-report.json ({report['environment']['device']}, torch "
                  f"{report['environment']['torch']}, {report['environment']['date']})"}


def validation(what: str, configuration: dict, predicted: float, measured: float | None,
               source: str | None, tolerance: float) -> dict:
    """The JSON's validation: the prediction against the GPU's measurement, and whether it
    lands within `tolerance` of it."""
    if measured is None:
        return {"configuration": configuration, "predicted": predicted, "measured": None,
                "source": "no GPU measurement of this configuration in docs/gpu-report.json"}
    return {"configuration": configuration, "what": what, "predicted": predicted,
            "measured": measured, "source": source, "predicted / measured": predicted / measured,
            "tolerance": tolerance, "within": abs(predicted / measured - 1) <= tolerance}


def table_lines(result: dict, unit: str, per: float) -> list[str]:
    """The table for a log: each class, then the slowest kernels, `per` seconds as 1 `unit`."""
    lines = [f"{'class':<16}{'kernels':>9}{'GFLOP':>10}{'GB':>9}{unit:>10}{'share':>7}"
             f"{'lost ' + unit:>10}"]
    total = sum(row["predicted_s"] for row in result["classes"].values()) or 1.0
    for name, row in result["classes"].items():
        lines.append(f"{name:<16}{row['kernels']:>9}{row['flops'] / 1e9:>10.1f}"
                     f"{row['bytes'] / 1e9:>9.2f}{row['predicted_s'] / per:>10.3f}"
                     f"{row['predicted_s'] / total:>7.1%}{row['lost_s'] / per:>10.3f}")
    lines += ["", "slowest kernels:", f"{'':4}{unit:>9}{'runs':>6}  {'class':<16} kernel"]
    lines += [f"{'':4}{row['predicted_s'] / per:>9.3f}{row['runs']:>6}  {row['class']:<16} "
              f"{row['name'][:60]} ({row['phase']})" for row in result["kernels"][:12]]
    return lines
