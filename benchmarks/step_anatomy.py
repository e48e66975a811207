"""Where a GPU step's time goes: every kernel of the compiled training step (or of one decode call
of the sampler), its FLOPs and bytes, and a named GPU's time for it, counted on a CPU.

    python benchmarks/step_anatomy.py [--preset small] [--gpu H200] [--micro 16]
        [--accumulation 8] [--zero 1] [--precision autocast_bf16] [--scope block]
        [key.sub=value ...] [--json FILE]
    python benchmarks/step_anatomy.py --decode [--preset small] [--batch-size 32]
        [--seq-len 1024] [--known 512] [--targets 1] [--gpu H200] [--json FILE]

Training: trainer/loop.py's step (the order sampler, the forward, the chunked loss, the backward,
DeepSpeed's optimizer step, the bad-step watch, the EMA), built from the preset as
trainer/main.py builds it and compiled as it compiles it, is recorded twice on this machine, at
micro-batches of 2 and 3 sequences of the preset's length (each in a process of its own, on a
small dataset of Python's documentation made on the spot), and read at --micro
(benchmarks/anatomy.py says why that is exact). Decode: one compiled call of the KV-cache
sampler in bf16 (the call trainer/sample.py replays as a CUDA graph on a GPU; the shapes of
benchmarks/decode_step.py). benchmarks/anatomy_record.py says where the recording takes a
GPU's path rather than the CPU's.

Each kernel is classed (matmul, attention, norm + AdaLN, loss, optimizer + EMA, orders/gathers,
copies, other) and timed on --gpu's roofline (benchmarks/roofline.py: published peaks and
public measurements, nothing fitted); the step's time adds the host's launches where the device
would wait for them. The table: per class its kernels, FLOPs, bytes, predicted time, share and
what it loses against its FLOPs at the peak, then the slowest kernels. The prediction is checked
against docs/gpu-report.json where it measured the same configuration (training within 15% of
its MFU, decode within 25% of its milliseconds), and MFU is given both ways: attention counted
whole (6N + 12 L d T per token, nanoGPT's and PaLM's count, the trainer's) and halved for causal
attention (6N + 6 L d T, Megatron's and MaxText's).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import anatomy
import torch
from anatomy_record import record_decode_call, record_training_step
from gpu_report_run import python_docs_corpus
from roofline import GPUS

from aogpt import UsageError, check_counts, cli_entry
from aogpt.files import write_json_atomic

PRESETS = ("tiny", "small", "medium")
TRAIN_TOLERANCE, DECODE_TOLERANCE = 0.15, 0.25
LOSS_CHUNK = 4096  # the presets' model.loss_chunk_size at the full micro-batch


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=PRESETS, default="small")
    parser.add_argument("--gpu", choices=sorted(GPUS), default="H200",
                        help="the GPU whose roofline times the kernels (default H200, measured)")
    parser.add_argument("--json", type=Path, help="also write the anatomy here")
    parser.add_argument("--decode", action="store_true", help="one decode call, not a step")
    parser.add_argument("--micro", type=int, default=16, help="sequences per micro-batch")
    parser.add_argument("--accumulation", type=int, default=8, help="micro-steps per step")
    parser.add_argument("--zero", type=int, choices=(1, 2, 3), default=1)
    parser.add_argument("--precision", choices=("autocast_bf16", "bf16"), default="autocast_bf16")
    parser.add_argument("--scope", choices=("block", "network"), default="block")
    parser.add_argument("--batch-size", type=int, default=32, help="decode: sequences")
    parser.add_argument("--seq-len", type=int, default=1024, help="decode: tokens per sequence")
    parser.add_argument("--known", type=int, default=512, help="decode: tokens known")
    parser.add_argument("--targets", type=int, default=1, help="decode: tokens drawn")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="training: run config settings (a lever's switch)")
    parser.add_argument("--kernels", type=Path,
                        help="a folder: the recorded kernels are kept there, or, if it holds "
                             "them, read from there instead of recorded (a new prediction from "
                             "the same recording; one cut short goes on from those it "
                             "finished)")
    parser.add_argument("--record", type=int, help=argparse.SUPPRESS)  # a child: this micro
    parser.add_argument("--record-to", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_counts(args, "micro", "batch_size", "seq_len", "known", "targets")
    if args.accumulation < 2:
        raise UsageError(f"--accumulation must be at least 2, got {args.accumulation}")
    if args.json is not None and args.json.is_dir():
        raise UsageError(f"--json {args.json} is a folder: give a file name")
    if args.kernels is not None and args.kernels.exists() and not args.kernels.is_dir():
        raise UsageError(f"--kernels {args.kernels} is a file: give a folder")
    if args.decode and args.known + args.targets > args.seq_len:
        raise UsageError("--known plus --targets must not exceed --seq-len")
    return args


def seq_len(preset: str) -> int:
    return 128 if preset == "tiny" else 1024


def configuration(args: argparse.Namespace) -> dict:
    """The configuration as the GPU report names its rows (and the decode call's shape)."""
    if args.decode:
        return {"preset": args.preset, "batch_size": args.batch_size, "seq_len": args.seq_len,
                "known": args.known, "targets": args.targets, "compiled": True,
                "cuda_graphs": True, "dtype": "bf16"}
    return {"preset": args.preset, "zero": args.zero, "precision": args.precision,
            "compile": True, "scope": args.scope, "micro": args.micro,
            "accumulation": args.accumulation, "seq_len": seq_len(args.preset),
            "overrides": args.overrides}


def child_overrides(args: argparse.Namespace, micro: int) -> list[str]:
    """The run config of a recording at `micro` sequences: RECORDED_MICRO_STEPS micro-steps per
    step, the loss in the full size's number of chunks."""
    length = seq_len(args.preset)
    return [f"model.block_size={length}", f"train.micro_batch_size={micro}",
            f"train.tokens_per_step={micro * length * anatomy.RECORDED_MICRO_STEPS}",
            f"model.loss_chunk_size={max(LOSS_CHUNK * micro // args.micro, 1)}",
            f"train.precision={args.precision}", "train.compile=true",
            f"train.compile_scope={args.scope}", "model.attn_impl=sdpa", "data.num_workers=0",
            *args.overrides]


def preset_files(args: argparse.Namespace) -> tuple[str, str]:
    config = "configs/tiny.yaml" if args.preset == "tiny" else f"configs/ao_gpt_{args.preset}.yaml"
    return config, f"ds_configs/zero{args.zero}.json"


def make_data(folder: Path, length: int) -> Path:
    """A pretraining folder of Python's documentation at `length` tokens per sequence."""
    out = folder / "data"
    done = subprocess.run([sys.executable, "data_prep/owt_to_mds.py", "--out", str(out),
                           "--source", str(python_docs_corpus(folder)), "--seq-len", str(length),
                           "--val-fraction", "0.05", "--workers", "1"], cwd=anatomy.REPO,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"data_prep/owt_to_mds.py failed: {done.stderr.strip()[-500:]}")
    return out


def record_child(args: argparse.Namespace, micro: int, data: Path, out: Path) -> None:
    """Records the step at `micro` in a process of its own (its own compilation, its own
    DeepSpeed engine)."""
    command = [sys.executable, __file__, "--preset", args.preset, "--zero", str(args.zero),
               "--precision", args.precision, "--scope", args.scope, "--micro", str(args.micro),
               "--record", str(micro), "--record-to", str(out), *args.overrides,
               f"data.path={data}"]
    print(f"recording the step at micro-batch {micro} (compiles first) ...", flush=True)
    done = subprocess.run(command, cwd=anatomy.REPO, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"recording at micro-batch {micro} failed:\n{done.stderr[-3000:]}")


def training_kernels(args: argparse.Namespace) -> list:
    """The kernels of one optimizer step at --micro and --accumulation (the recordings --kernels
    holds are read, the others made: a run cut short after one goes on from it)."""
    files = [f"kernels_{micro}.json" for micro in anatomy.RECORDED_MICRO_BATCHES]
    with tempfile.TemporaryDirectory(prefix="aogpt_anatomy_") as scratch:
        folder = args.kernels or Path(scratch)
        missing = [(micro, name) for micro, name in zip(anatomy.RECORDED_MICRO_BATCHES, files,
                                                        strict=True)
                   if not (folder / name).is_file()]
        if missing:
            folder.mkdir(parents=True, exist_ok=True)
            data = make_data(Path(scratch), seq_len(args.preset))
            for micro, name in missing:
                record_child(args, micro, data, folder / name)
        recorded = [anatomy.from_json(json.loads((folder / name).read_text())) for name in files]
    step = anatomy.extrapolate(*recorded, args.micro)
    return anatomy.optimizer_step(step, args.accumulation)


def model_flops(args: argparse.Namespace) -> tuple[float, float]:
    """FLOPs per token of the preset's model: attention whole, and halved for causal."""
    from aogpt.model import AOGPT
    from aogpt.trainer.config import load_config

    config = load_config(preset_files(args)[0], [f"model.block_size={seq_len(args.preset)}"])
    model = AOGPT.unfilled(config.model)
    whole = model.flops_per_token(seq_len(args.preset))
    c = config.model
    return whole, whole - 6 * c.n_layer * c.n_embd * seq_len(args.preset)


def training_anatomy(args: argparse.Namespace) -> dict:
    kernels = training_kernels(args)
    gpu = GPUS[args.gpu]
    result = anatomy.prediction(kernels, gpu, causal=True, in_graph=False)
    result["by_gpu"] = by_gpu(kernels, causal=True)
    tokens = args.micro * args.accumulation * seq_len(args.preset)
    whole, causal = model_flops(args)
    step_s = result["predicted_s"]
    result.update(
        what="training step", configuration=configuration(args), tokens_per_step=tokens,
        predicted_step_s=step_s, predicted_step_ms=step_s * 1e3,
        predicted_tokens_per_s=tokens / step_s,
        predicted_mfu=whole * tokens / step_s / gpu.peak_flops,
        predicted_mfu_causal=causal * tokens / step_s / gpu.peak_flops,
        flops_per_token={"counted": anatomy.matmul_attention_flops(kernels) / tokens,
                         "model (6N + 12 L d T)": whole})
    measured = measured_on(args, anatomy.measured_training(configuration(args)))
    result["validation"] = anatomy.validation(
        "MFU (6N + 12 L d T)", configuration(args), result["predicted_mfu"],
        measured and measured["mfu"], measured and measured["source"], TRAIN_TOLERANCE)
    return result


def by_gpu(kernels: list, causal: bool) -> dict:
    """Each GPU's prediction per class, for the GPU report to set beside what it measures."""
    return {name: anatomy.classes(kernels, gpu, causal) for name, gpu in GPUS.items()}


def measured_on(args: argparse.Namespace, measured: dict | None) -> dict | None:
    """A measurement of the report's GPU, if it is --gpu (and nothing was changed by a lever)."""
    if measured is None or args.overrides or args.gpu not in measured["source"]:
        return None
    return measured


def decode_anatomy(args: argparse.Namespace) -> dict:
    kept = args.kernels / "kernels_decode.json" if args.kernels else None
    if kept is not None and kept.is_file():
        kernels = anatomy.from_json(json.loads(kept.read_text()))
    else:
        kernels = record_decode_call(args.preset, args.batch_size, args.seq_len, args.known,
                                     args.targets)
        if kept is not None:
            write_json_atomic(anatomy.to_json(kernels), kept)
    result = anatomy.prediction(kernels, GPUS[args.gpu], causal=False, in_graph=True)
    result["by_gpu"] = by_gpu(kernels, causal=False)
    result.update(what="decode call", configuration=configuration(args),
                  predicted_call_ms=result["predicted_s"] * 1e3,
                  kernels_per_call=result["kernels_per_step"])
    measured = measured_on(args, anatomy.measured_decode(configuration(args)))
    result["validation"] = anatomy.validation(
        "ms per call (compiled + CUDA graphs)", configuration(args), result["predicted_call_ms"],
        measured and measured["call_ms"], measured and measured["source"], DECODE_TOLERANCE)
    if measured:
        result["validation"]["measured_kernels"] = measured["kernels"]
    return result


def report(result: dict, decode: bool) -> None:
    unit, per = ("us", 1e-6) if decode else ("ms", 1e-3)
    print("\n".join(anatomy.table_lines(result, unit, per)))
    total = (f"decode call: {result['predicted_call_ms']:.3f} ms predicted, "
             f"{result['kernels_per_call']} kernels" if decode else
             f"training step: {result['predicted_step_s'] * 1e3:.1f} ms predicted, MFU "
             f"{result['predicted_mfu']:.1%} (attention whole) / "
             f"{result['predicted_mfu_causal']:.1%} (causal halved), "
             f"{result['kernels_per_step']} kernels")
    print(f"{total} on {result['gpu']}; the host's launches add "
          f"{result['host_bound_s'] / per:.3f} {unit}; most lost: {result['most_lost']}")
    check = result["validation"]
    if check["measured"] is not None:
        print(f"validation: predicted / measured {check['predicted / measured']:.2f} "
              f"(within {check['tolerance']:.0%}: {check['within']}; {check['source']})")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.record is not None:  # a child: one recording, to a file
        config, ds_config = preset_files(args)
        kernels = record_training_step(config, ds_config, child_overrides(args, args.record))
        write_json_atomic(anatomy.to_json(kernels), args.record_to)
        return 0
    torch.manual_seed(0)
    result = decode_anatomy(args) if args.decode else training_anatomy(args)
    report(result, args.decode)
    if args.json:
        write_json_atomic(result, args.json, indent=1)
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
