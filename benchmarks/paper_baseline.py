"""The paper's own trainer and sampler beside ours, on the same device: ratios.

    python benchmarks/paper_baseline.py --paper PATH [--part train,generation] [--smoke]
        [--train-modes eager,compiled] [--steps 64,1024] [--samples B] [--repeats K]
        [--released-only] [--json OUT]

PATH is a checkout of the paper's code (github.com/scxue/AO-GPT-MDM), or a folder holding its
files. That repository has no licence: its files are imported from PATH at run time and nothing of
them is in this one. Used: model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm.py (its training model),
ema.py, model_AOGPT_generate.py (its KV-cache generator) and catsample.py (its top-p sampling).

train       the inner loop of its train_AOGPT_CL.py as that script runs it: micro-steps of
            model(X, mode="Random_CL", random_ratio=0.9) (10% left-to-right orders) under bf16
            autocast on a GPU (fp32 on a CPU, as the script does), the loss divided by the
            accumulation, backward; then clip_grad_norm_(1.0), its fused AdamW
            (configure_optimizers), its EMA's update, zero_grad; on random tokens made on the
            device; compiled (torch.compile(model), as its `compile` flag does) and not (as
            released). Beside it, in the same process at the same shapes: our network, chunked loss
            and order sampler (mixture, 10% left to right) in the same loop (fused AdamW, clipping,
            an EMA of every weight), eager and compiled (compile_for_training, as the trainer
            does). Both are bare steps (no loader, no DeepSpeed, no logging): like with like.
            Each loop's first step (its compilation) is timed apart, never counted; `best` sets
            each side's fastest mode against the other's (gpu_report.py's training ratio).
generation  its generate() (a random order per sample, the linear schedule, top-p 1, temperature
            1: its sample_AOGPT.py's settings) and our KV-cache sampler (model/sampler/) with the
            same settings and THE SAME WEIGHTS: the paper's generator, randomly initialised from a
            seed, saved as our checkpoint under the same names (model/official.py's names are
            the paper's) and loaded as trainer/sample.py loads one (load_checkpoint). Each run is
            a fresh process that generates twice: the first call, timed from the process's
            start to the samples on the host (imports, model build, weight load, compilation:
            "first samples"), then the same call again, timed alone ("generation": compilation
            never counts as generation). The paper's sampler runs in each of its configurations
            (its @torch.compile decorators on, as released, or off; bf16 autocast over fp32
            weights, as its script, or weights cast to the dtype) and its fastest generation
            counts; ours with its sampler's defaults, as trainer/sample.py runs so few calls
            (CUDA graphs on a GPU, not compiled; eager on a CPU), in bf16 where the device has it.

Its generate() makes sequences of 1024 tokens (a constant in its code): the models have a block
of 1024. Runs are interleaved and the best of --repeats kept. Defaults: the small model, 32
samples on a GPU, 4 on a CPU, S = 64 and 1024. --smoke: a 1-layer model of width 32 and S = 4, 8,
to check the machinery (the tests run it against a stand-in of the paper's files). The JSON is
written after every row (benchmarks/results.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from results import ResultsFile, why

from aogpt import RunFailure, UsageError, check_counts, cli_entry
from aogpt.model import (
    AOGPT,
    ModelConfig,
    OrderConfig,
    OrderSampler,
    load_checkpoint,
    save_consolidated,
)
from aogpt.model.precision import auto_dtype, resolve_device
from aogpt.model.sampler import KVCacheSampler, SamplingConfig

PAPER_FILES = ("model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm.py", "ema.py",
               "model_AOGPT_generate.py", "catsample.py")
PARTS = ("train", "generation")
TRAIN_MODES = {"eager": False, "compiled": True}
SEQ_LEN = 1024  # the paper's generate() makes 1024 tokens, whatever its config says
# the paper's small model ("124M"), and a stand-in-sized one for --smoke
SIZES = {"small": {"n_layer": 12, "n_head": 12, "n_embd": 768},
         "smoke": {"n_layer": 1, "n_head": 2, "n_embd": 32}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paper", type=Path, required=True,
                        help="a checkout of github.com/scxue/AO-GPT-MDM (or a folder of its files)")
    parser.add_argument("--part", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, any device (CI)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    parser.add_argument("--steps", help="generation: comma list of step counts (default 64,1024)")
    parser.add_argument("--samples", type=int, help="generation: sequences (GPU 32, CPU 4)")
    parser.add_argument("--micro-batch", type=int, help="train: sequences per micro-step (16)")
    parser.add_argument("--accumulation", type=int, default=8, help="train: micro-steps per step")
    parser.add_argument("--train-steps", type=int, default=4, help="train: timed optimizer steps")
    parser.add_argument("--train-modes", default="eager,compiled",
                        help="train: comma list of eager, compiled (both loops in each)")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of each, best kept")
    parser.add_argument("--released-only", action="store_true",
                        help="generation: only the paper sampler's released configuration "
                             "(compile on, bf16 autocast), to save time")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a generation run in its own process
    parser.add_argument("--weights", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.part.split(",") if p.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        raise UsageError(f"--part: unknown part(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(PARTS)}")
    args.train_modes = [m.strip() for m in args.train_modes.split(",") if m.strip()]
    unknown = sorted(set(args.train_modes) - set(TRAIN_MODES))
    if unknown or not args.train_modes:
        raise UsageError(f"--train-modes: unknown mode(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(TRAIN_MODES)}")
    device = resolve_device(args.device)
    on_gpu = device.type == "cuda"
    args.device = str(device)  # a name: each worker is given it as --device
    args.size = "smoke" if args.smoke else "small"
    try:
        default = "4,8" if args.smoke else "64,1024"
        args.step_counts = [int(s) for s in (args.steps or default).split(",")]
    except ValueError as err:
        raise UsageError(f"--steps must be a comma list of integers: {err}") from None
    if any(not 1 <= s <= SEQ_LEN for s in args.step_counts):
        raise UsageError(f"--steps must each be in 1..{SEQ_LEN} (the paper's sequence length)")
    if args.samples is None:
        args.samples = 1 if args.smoke else 32 if on_gpu else 4
    if args.micro_batch is None:
        args.micro_batch = 2 if args.smoke else 16
    check_counts(args, "samples", "micro_batch", "accumulation", "train_steps", "repeats")
    if args.json is not None and args.json.is_dir():
        raise UsageError(f"--json {args.json} is a folder: give a file name")
    return args


def paper_folder(path: Path) -> Path:
    """The folder holding the paper's files: a checkout, or a folder they were copied to."""
    if not path.is_dir():
        raise UsageError(f"--paper {path} is not a folder: give a checkout of "
                         "github.com/scxue/AO-GPT-MDM")
    missing = [name for name in PAPER_FILES if not (path / name).is_file()]
    if missing:
        raise UsageError(f"--paper {path} lacks {', '.join(missing)}: give a checkout of "
                         "github.com/scxue/AO-GPT-MDM")
    return path.resolve()


def import_paper(folder: Path, module: str):
    """One of the paper's modules, imported from its folder (their imports are flat)."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return __import__(module)


def our_config(size: str) -> ModelConfig:
    return ModelConfig(**SIZES[size], block_size=SEQ_LEN, cond_dim=128)  # the paper's 128-d code


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ---- train ---------------------------------------------------------------------------------------


def time_loop(step, args) -> tuple[float, float]:
    """Tokens/s of `step()` (one optimizer step) after one untimed step, and that first step's
    seconds (its compilation)."""
    start = time.perf_counter()
    step()
    synchronize(args.device)
    first_step_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(args.train_steps):
        step()
    synchronize(args.device)
    tokens = args.train_steps * args.accumulation * args.micro_batch * SEQ_LEN
    return tokens / (time.perf_counter() - start), first_step_s


def autocast(device: str):
    """bf16 autocast on a GPU, none on a CPU: what the paper's script does."""
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def paper_train_step(folder: Path, args, compiled: bool):
    model_file = import_paper(folder, PAPER_FILES[0].removesuffix(".py"))
    ema_file = import_paper(folder, "ema")
    torch.manual_seed(0)
    config = model_file.AOGPTConfig(**SIZES[args.size], block_size=SEQ_LEN, bias=True,
                                    vocab_size=50304, dropout=0.0)
    with contextlib.redirect_stdout(sys.stderr):  # it prints its parameter counts
        model = model_file.AOGPT(config).to(args.device)
        optimizer = model.configure_optimizers(0.05, 6e-4, (0.9, 0.95), args.device.split(":")[0])
    ema = ema_file.ExponentialMovingAverage(model.parameters(), decay=1 - 1e-4)
    if compiled:
        model = torch.compile(model)

    def step():
        for _ in range(args.accumulation):
            x = torch.randint(0, 50257, (args.micro_batch, SEQ_LEN), device=args.device)
            with autocast(args.device):
                _, loss = model(x, mode="Random_CL", random_ratio=0.9)
                loss = loss / args.accumulation
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        ema.update(model.parameters())
        optimizer.zero_grad(set_to_none=True)

    return step


def our_train_step(args, compiled: bool):
    torch.manual_seed(0)
    model = AOGPT(our_config(args.size)).to(args.device).train()
    orders = OrderSampler(OrderConfig(kind="mixture", p_left_to_right=0.1), SEQ_LEN, seed=0)
    if compiled:
        model.compile_for_training()
        orders.compile()
    optimizer = torch.optim.AdamW(model.param_groups(0.05), lr=6e-4, betas=(0.9, 0.95), fused=True)
    params = list(model.parameters())
    shadow = [p.detach().clone() for p in params]
    updates = [0]

    def step():
        for _ in range(args.accumulation):
            x = torch.randint(0, 50257, (args.micro_batch, SEQ_LEN), device=args.device)
            ids = torch.arange(args.micro_batch, device=args.device)
            with autocast(args.device):
                _, loss = model(x, orders(updates[0], ids)[0], return_mean=True)
            (loss / args.accumulation).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        torch._foreach_lerp_(shadow, [p.detach() for p in params], 1e-4)  # the EMA
        optimizer.zero_grad(set_to_none=True)
        updates[0] += 1

    return step


def measure_training(folder: Path, args, results: ResultsFile) -> None:
    rows = results.data["train"] = []
    for mode in args.train_modes:
        compiled = TRAIN_MODES[mode]
        paper, paper_first_s = time_loop(paper_train_step(folder, args, compiled), args)
        ours, ours_first_s = time_loop(our_train_step(args, compiled), args)
        rows.append({"compiled": compiled, "paper_tokens_per_s": paper, "ours_tokens_per_s": ours,
                     "ratio": ours / paper, "paper_first_step_s": paper_first_s,
                     "ours_first_step_s": ours_first_s})
        print(f"  train, {mode}: paper {paper:,.0f} tokens/s, ours {ours:,.0f} tokens/s: "
              f"{ours / paper:.2f}x (first steps, with compilation: paper {paper_first_s:.1f} s, "
              f"ours {ours_first_s:.1f} s)", flush=True)
        paper_best = max(rows, key=lambda row: row["paper_tokens_per_s"])
        ours_best = max(rows, key=lambda row: row["ours_tokens_per_s"])
        results.data["train_best"] = {
            "paper_compiled": paper_best["compiled"], "ours_compiled": ours_best["compiled"],
            "paper_tokens_per_s": paper_best["paper_tokens_per_s"],
            "ours_tokens_per_s": ours_best["ours_tokens_per_s"],
            "ratio": ours_best["ours_tokens_per_s"] / paper_best["paper_tokens_per_s"]}
        results.row_done()


# ---- generation ----------------------------------------------------------------------------------

def paper_modes(args) -> list[dict]:
    """The paper sampler's configurations: @torch.compile on (as released) or off; bf16
    autocast over fp32 weights (its script) or weights cast to bf16; fp32 alone where the device
    has no fast bf16."""
    bf16 = auto_dtype(torch.device(args.device)) == torch.bfloat16
    if args.released_only:
        return [{"compile": True, "autocast": bf16}]
    return [{"compile": c, "autocast": a} for c in (True, False) for a in ((True, False) if bf16
                                                                             else (False,))]


def worker(args) -> int:
    """One sampler in this (fresh) process: generates twice and prints a JSON line with the
    seconds from the process's start to the first samples, and those of the second call."""
    spec = json.loads(args.worker)
    if spec["side"] == "paper" and not spec["compile"]:
        torch._dynamo.config.disable = True  # its @torch.compile decorators become no-ops
    device = args.device
    dtype = auto_dtype(torch.device(device))
    if spec["side"] == "paper":
        state = torch.load(args.weights, map_location="cpu", weights_only=True)
        generator = import_paper(args.paper.resolve(), "model_AOGPT_generate")
        config = generator.AOGPTConfig(**SIZES[args.size], block_size=SEQ_LEN, vocab_size=50304,
                                       dropout=0.0, bias=True)
        with contextlib.redirect_stdout(sys.stderr):
            model = generator.AOGPT(config)
        model.load_state_dict(state)
        model = model.to(device).eval()
        if not spec["autocast"]:
            model = model.to(dtype)
        context = (torch.autocast(device.split(":")[0], dtype=dtype) if spec["autocast"]
                   else contextlib.nullcontext())

        def generate() -> torch.Tensor:
            with torch.no_grad(), context, contextlib.redirect_stdout(sys.stderr):
                return model.generate(args.samples, spec["steps"], device, schedules="linear",
                                      topp=1.0, temperature=1.0)
    else:  # as trainer/sample.py loads a checkpoint: no time spent initialising weights
        model = load_checkpoint(args.weights.with_suffix(""), weights="raw")
        model = model.to(device=device, dtype=dtype).eval()
        sampler = KVCacheSampler(model, args.samples, SEQ_LEN,
                                 SamplingConfig(steps=spec["steps"], top_p=1.0, temperature=1.0))

        def generate() -> torch.Tensor:
            return sampler.generate(torch.arange(args.samples)).tokens

    tokens = generate().cpu()  # the first samples on the host
    first_samples_s = time.time() - spec["started"]
    start = time.perf_counter()
    generate().cpu()  # compiled, captured: generation alone
    generate_s = time.perf_counter() - start
    print(json.dumps({"first_samples_s": first_samples_s, "generate_s": generate_s,
                      "shape": list(tokens.shape)}))
    return 0


def run_worker(args, weights: Path, spec: dict) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--paper", str(args.paper),
               "--device", args.device, "--samples", str(args.samples), "--weights", str(weights),
               "--worker", json.dumps({**spec, "started": time.time()})]
    command += ["--smoke"] if args.smoke else []
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    if done.returncode:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise RuntimeError(f"the {spec['side']} sampler failed ({spec}): {lines[-1]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["shape"] != [args.samples, SEQ_LEN]:
        raise RuntimeError(f"the {spec['side']} sampler made {result['shape']} tokens")
    return {"first_samples_s": result["first_samples_s"], "generate_s": result["generate_s"]}


def shared_weights(folder: Path, args, scratch: Path) -> Path:
    """The paper generator's weights (random init, seed 0): as a torch file for its code, and
    the same tensors as our consolidated checkpoint next to it (weights.pt, weights/)."""
    generator = import_paper(folder, "model_AOGPT_generate")
    torch.manual_seed(0)
    config = generator.AOGPTConfig(**SIZES[args.size], block_size=SEQ_LEN, vocab_size=50304,
                                   dropout=0.0, bias=True)
    with contextlib.redirect_stdout(sys.stderr):
        state = generator.AOGPT(config).state_dict()
    path = scratch / "weights.pt"
    torch.save(state, path)
    save_consolidated(path.with_suffix(""), our_config(args.size), state, None,
                      source="the paper's generator, random init")  # its names are ours
    return path


def measure_generation(folder: Path, args, results: ResultsFile) -> None:
    rows = results.data["generation"] = []
    with tempfile.TemporaryDirectory(prefix="aogpt_paper_baseline_") as tmp:
        weights = shared_weights(folder, args, Path(tmp))
        for steps in args.step_counts:
            best: dict[str, dict] = {}
            for _ in range(args.repeats):  # interleaved: load from elsewhere hits all alike
                specs = [{"side": "ours"}] + [{"side": "paper", **m} for m in paper_modes(args)]
                for spec in specs:
                    key = json.dumps(spec, sort_keys=True)
                    timing = run_worker(args, weights, {**spec, "steps": steps})
                    if key not in best or timing["generate_s"] < best[key]["generate_s"]:
                        best[key] = {**spec, **timing}
            ours = best[json.dumps({"side": "ours"})]
            papers = [row for row in best.values() if row["side"] == "paper"]
            paper = min(papers, key=lambda row: row["generate_s"])
            row = {"steps": steps, "samples": args.samples, "ours": ours, "paper": paper,
                   "paper_modes": papers,
                   "ratio_first_samples": paper["first_samples_s"] / ours["first_samples_s"],
                   "ratio_generate": paper["generate_s"] / ours["generate_s"]}
            rows.append(row)
            print(f"  generation S = {steps}: ours {ours['generate_s']:.2f} s (first samples "
                  f"{ours['first_samples_s']:.1f} s after its start), paper's best (compile "
                  f"{'on' if paper['compile'] else 'off'}, "
                  f"{'autocast' if paper['autocast'] else 'cast weights'}) "
                  f"{paper['generate_s']:.2f} s (first samples {paper['first_samples_s']:.1f} s): "
                  f"{row['ratio_generate']:.2f}x generation, {row['ratio_first_samples']:.2f}x "
                  "to the first samples", flush=True)
            results.row_done()


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folder = paper_folder(args.paper)
    if args.worker:
        return worker(args)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"the paper's code ({folder}) beside ours on {name}, {torch.get_num_threads()} threads, "
          f"{args.size} model", flush=True)
    results = ResultsFile(args.json, {"device": name, "size": args.size,
                                      "threads": torch.get_num_threads(),
                                      "torch": torch.__version__})
    try:
        if "train" in args.parts:
            measure_training(folder, args, results)
        if "generation" in args.parts:
            measure_generation(folder, args, results)
    except RuntimeError as err:
        raise RunFailure(why(str(err))) from None
    results.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
