"""What the precision does to training: the same tiny AO-GPT run in fp32, autocast_bf16 and bf16.

    python benchmarks/precision_effect.py [--steps 300] [--out runs/precision_effect]
        [--precisions fp32,autocast_bf16,bf16] [--device cpu|gpu]

Each precision trains `trainer/main.py` from the same seed on the same tokens (Python's reference
manual, tokenized by data_prep/owt_to_mds.py; configs/tiny.yaml, one process, ZeRO-1) and is
evaluated on the same held-out sequences at the end. Prints the final training loss (mean of the
last 20% of logged steps), the held-out left-to-right and any-order losses, each precision's
difference to fp32, and the wall time. What differs between the arms is only the arithmetic:

    fp32           fp32 weights and activations
    autocast_bf16  fp32 weights and residual stream, bf16 matmuls (how the paper trained)
    bf16           DeepSpeed's bf16 mode: bf16 weights and activations, fp32 master weights

AO-GPT's AdaLN gates start near 1e-3, so early block updates are far smaller than the bf16
residual stream can resolve (its spacing is 2^-8 of the value); bf16 rounds many of them away.
Before training, the benchmark measures that directly on AO-GPT small at init: the summed block
updates (residual stream after the last block minus the embeddings) in each precision against
float64 (--init-error-only: just that, a minute).

On a CPU without native bf16 (AVX2 only) the two bf16 arms run ~8x slower than fp32: with the
defaults here, about half an hour for all three on 2 cores. A finished arm's result is kept in its
folder and reused by a re-run into the same --out.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from aogpt import UsageError, cli_entry
from aogpt.data_prep.corpora import python_docs
from aogpt.files import write_json_atomic
from aogpt.model import AOGPT
from aogpt.model.config import small
from aogpt.run_folder import RunFolder
from aogpt.trainer.metrics import read_metrics

REPO = Path(__file__).resolve().parent.parent
PRECISIONS = ("fp32", "autocast_bf16", "bf16")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per arm")
    parser.add_argument("--tokens-per-step", type=int, default=512, help="4 sequences of 128")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="cpu: gloo and ds_configs/cpu.json; gpu: ds_configs/zero1.json")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "precision_effect")
    parser.add_argument("--init-error-only", action="store_true",
                        help="only measure the block updates' error at init (no training)")
    args = parser.parse_args(argv)
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    unknown = [p for p in args.precisions if p not in PRECISIONS]
    if unknown or not args.precisions:
        raise UsageError(f"--precisions: use a comma list of {', '.join(PRECISIONS)}")
    if args.steps < 10 or args.tokens_per_step % 128:
        raise UsageError("--steps must be >= 10 and --tokens-per-step a multiple of 128")
    return args


@torch.no_grad()
def block_update_errors(tokens: int = 1024) -> dict[str, float]:
    """Relative error of AO-GPT small's summed block updates at init, per precision, vs float64."""
    torch.manual_seed(0)
    model = AOGPT(small()).eval()
    t = 256
    idx = torch.randint(0, 50257, (tokens // t, t))
    orders = torch.stack([torch.randperm(t) for _ in range(len(idx))])
    stream = model.training_stream(idx, orders)[:3]

    def summed_updates(net: AOGPT, autocast: bool) -> torch.Tensor:
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            x, cond = net.embed(*stream)
            start = x
            for block in net.transformer.h:
                x = block(x, cond)
        return (x - start).double()

    reference = summed_updates(copy.deepcopy(model).double(), autocast=False)
    arms = {"fp32": (model, False), "autocast_bf16": (model, True),
            "bf16": (copy.deepcopy(model).to(torch.bfloat16), False)}
    return {name: ((summed_updates(net, autocast) - reference).norm() / reference.norm()).item()
            for name, (net, autocast) in arms.items()}


def prepare_data(out: Path) -> Path:
    data = out / "data"
    if (data / "manifest.json").is_file():
        return data
    source = python_docs(out)
    done = subprocess.run([sys.executable, "data_prep/owt_to_mds.py", "--out", str(data),
                           "--source", str(source), "--seq-len", "128", "--val-fraction", "0.05",
                           "--workers", "2"], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise UsageError(f"data_prep/owt_to_mds.py failed: {done.stderr.strip().splitlines()[-1]}")
    return data


def train(precision: str, data: Path, args) -> dict:
    """The arm's result, from its folder when it finished before (same steps)."""
    run = args.out / precision
    result = run / "result.json"
    if result.is_file():
        return json.loads(result.read_text())
    steps = args.steps
    env_cpu = args.device == "cpu"
    command = [
        sys.executable, "trainer/main.py",
        "--ds_config", "ds_configs/cpu.json" if env_cpu else "ds_configs/zero1.json",
        "--config", "configs/tiny.yaml", f"out_dir={run}", f"data.path={data}",
        f"train.precision={precision}", "train.compile=false", f"train.max_steps={steps}",
        f"train.tokens_per_step={args.tokens_per_step}", "train.micro_batch_size=4",
        "train.log_every=5", "optim.warmup_steps=20", f"optim.decay_steps={steps}",
        f"eval.every={steps}", "eval.batches=16", "eval.num_orders=2",
        f"checkpoint.every={steps}", "logging.wandb='off'", "data.num_workers=1",
    ]
    start = time.perf_counter()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""} if env_cpu else None  # gloo, no GPU
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode:
        lines = done.stderr.strip().splitlines() or ["no output"]
        raise UsageError(f"the {precision} run failed: {lines[-1]}")
    records = read_metrics(RunFolder(run).metrics_file)
    losses = [r["loss"] for r in records if r.get("loss") is not None]
    tail = losses[-max(1, len(losses) // 5):]
    final = [r for r in records if r.get("val_loss_l2r") is not None][-1]
    row = {"precision": precision, "train_loss": sum(tail) / len(tail),
           "val_loss_l2r": final["val_loss_l2r"], "val_loss_ao": final["val_loss_ao"],
           "seconds": seconds, "first_loss": losses[0]}
    write_json_atomic(row, result)
    return row


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    errors = block_update_errors()
    print("AO-GPT small at init, summed block updates vs float64: "
          + ", ".join(f"{name} {error:.2%}" for name, error in errors.items()), flush=True)
    if args.init_error_only:
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    data = prepare_data(args.out)
    rows = []
    for precision in args.precisions:
        print(f"training {precision} ({args.steps} steps of {args.tokens_per_step} tokens) ...",
              flush=True)
        rows.append(train(precision, data, args))
    base = next((r for r in rows if r["precision"] == "fp32"), None)
    print(f"\n{'precision':<15}{'train loss':>12}{'val l2r':>10}{'val AO':>10}"
          f"{'AO - fp32':>11}{'seconds':>9}")
    for r in rows:
        delta = f"{r['val_loss_ao'] - base['val_loss_ao']:+.4f}" if base else "n/a"
        print(f"{r['precision']:<15}{r['train_loss']:>12.4f}{r['val_loss_l2r']:>10.4f}"
              f"{r['val_loss_ao']:>10.4f}{delta:>11}{r['seconds']:>9.0f}")
    write_json_atomic({"steps": args.steps, "tokens_per_step": args.tokens_per_step,
                       "device": args.device, "rows": rows, "init_block_update_error": errors},
                      args.out / "precision_effect.json")
    print(f"\nresults: {args.out / 'precision_effect.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
