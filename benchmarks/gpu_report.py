"""Everything this stack claims about GPUs, measured in one command: `make gpu-report`.

    python benchmarks/gpu_report.py [--out docs/gpu-report.md] [--only train,e2e,generation,tests]
    python benchmarks/gpu_report.py --smoke --out /tmp/report.md        (CPU, a minute: what CI runs)

On one GPU (the goals are for one H100; the whole report takes about 9 minutes there):
  train       training tokens/s, MFU and peak memory of AO-GPT small and medium at seq 1024,
              through the real trainer (benchmarks/train_throughput.py: DeepSpeed engine,
              streaming loader, EMA): ZeRO-1 and ZeRO-2, autocast_bf16 and DeepSpeed's bf16,
              compiled and eager, SDPA and flash-attn (when installed)
  e2e         `trainer/main.py` with the default small recipe for 30 steps (shorter warm-up and
              fewer tokens per step so it fits): the loss falls, a checkpoint is written, and a
              second launch resumes from it
  generation  the KV-cache decoder against the encoder baseline (benchmarks/generation_speed.py),
              n = 1024, batch 32, S = 64, 256, 1024, CUDA graphs on
  tests       `pytest -m gpu`: what only a GPU can check

Training data is made on the spot from Python's own documentation (real English, tokenized by
data_prep/owt_to_mds.py), so the report needs no dataset and no network. Writes the markdown
report (`--out`) and the same numbers as JSON next to it; every part runs in its own process,
so one failure is reported in its row and the rest still runs. --smoke runs every part at
tiny scale on whatever device there is, to check the machinery (CI runs it on CPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from aogpt import UsageError, cli_entry
from aogpt.data_prep.corpora import python_docs
from aogpt.files import write_json_atomic, write_text_atomic
from aogpt.model.run_folder import RunFolder
from aogpt.trainer.metrics import read_metrics

REPO = Path(__file__).resolve().parent.parent
PARTS = ("train", "e2e", "generation", "tests")
GOALS = {"small": 0.45, "medium": 0.50}  # MFU on one H100 (llm-foundry reaches 43-50% on A100)
GENERATION_GOAL = 65.0  # encoder / decoder time at S = n = 1024 (Eso-LMs' claim over MDMs)
ACCUMULATION = 8  # micro-steps per optimizer step in the throughput runs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "gpu-report.md")
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, any device (CI)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per measurement")
    parser.add_argument("--merge", action="store_true",
                        help="keep what is not measured now from the report's existing JSON")
    parser.add_argument("--train-filter", action="append", default=[], metavar="KEY=VALUE",
                        help="measure only the training rows with this setting, e.g. "
                             "precision=autocast_bf16 (repeatable; with --merge the others stay)")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        raise UsageError(f"--only: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if not args.smoke and not torch.cuda.is_available():
        raise UsageError("no CUDA GPU here: the report measures GPUs (use --smoke to check it on CPU)")
    return args


def run(command: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, float]:
    """Exit status, output (stdout + stderr) and seconds of a command run from the repo root."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
        return done.returncode, done.stdout + done.stderr, time.perf_counter() - start
    except subprocess.TimeoutExpired as err:
        output = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part
                         for part in (err.stdout or "", err.stderr or ""))
        return 124, output + f"\n(timed out after {timeout:.0f} s)", time.perf_counter() - start


def failure(output: str) -> str:
    """The line of a failed run that says why (its last error line, else its last line)."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|Error|timed out", line)]
    return (errors or lines or ["no output"])[-1][:300]


# ---- the data --------------------------------------------------------------------------------------


def make_data(folder: Path, seq_len: int) -> Path:
    """A pretraining folder (train + val) of Python's documentation, tokenized by owt_to_mds.py."""
    source = python_docs(folder, copies=3)
    out = folder / f"data_{seq_len}"
    code, output, _ = run([sys.executable, "data_prep/owt_to_mds.py", "--out", str(out),
                           "--source", str(source), "--seq-len", str(seq_len),
                           "--val-fraction", "0.05", "--workers", str(min(8, os.cpu_count() or 1))],
                          timeout=300)
    if code:
        raise RuntimeError(f"data_prep/owt_to_mds.py failed: {failure(output)}")
    return out


# ---- the parts -------------------------------------------------------------------------------------


def train_grid(smoke: bool) -> list[dict]:
    """The training configurations measured: (preset, zero stage, precision, compile, attention)."""
    if smoke:
        return [{"preset": "tiny", "zero": 1, "precision": "fp32", "compile": False, "attn": "sdpa"}]
    from aogpt.model.attention import flash_attn_func

    attentions = ["sdpa", "flash_attn"] if flash_attn_func is not None else ["sdpa"]
    grid = []
    for preset in ("small", "medium"):
        for zero in (1, 2):
            for precision in ("autocast_bf16", "bf16"):
                grid.append({"preset": preset, "zero": zero, "precision": precision,
                             "compile": True, "attn": "sdpa"})
        grid.append({"preset": preset, "zero": 2, "precision": "autocast_bf16", "compile": False,
                     "attn": "sdpa"})
        for attn in attentions[1:]:
            grid.append({"preset": preset, "zero": 2, "precision": "autocast_bf16",
                         "compile": True, "attn": attn})
    return grid


SETTING = ("preset", "zero", "precision", "compile", "attn")


def selected(grid: list[dict], filters: list[str]) -> list[dict]:
    """The grid rows whose settings match every KEY=VALUE filter (compared as text)."""
    wanted = [f.split("=", 1) for f in filters]
    bad = [f for f, w in zip(filters, wanted, strict=True) if len(w) != 2 or w[0] not in SETTING]
    if bad:
        raise UsageError(f"--train-filter {bad[0]}: use KEY=VALUE with KEY in {', '.join(SETTING)}")
    return [row for row in grid if all(str(row[k]) == v for k, v in wanted)]


def merged_rows(kept: list[dict], new: list[dict]) -> list[dict]:
    """The kept rows, each replaced by a new measurement of the same setting; new ones appended."""
    key = lambda row: tuple(row[k] for k in SETTING)  # noqa: E731
    fresh = {key(row): row for row in new}
    rows = [fresh.pop(key(row), row) for row in kept]
    return rows + list(fresh.values())


def measure_training(grid: list[dict], data: Path, scratch: Path, args) -> list[dict]:
    rows = []
    for i, setting in enumerate(grid):
        result = scratch / f"train_{i}.json"
        micro = 4 if args.smoke else 16
        seq = 128 if args.smoke else 1024
        config = "configs/tiny.yaml" if setting["preset"] == "tiny" else f"configs/ao_gpt_{setting['preset']}.yaml"
        ds_config = "ds_configs/cpu.json" if args.smoke else f"ds_configs/zero{setting['zero']}.json"
        command = [sys.executable, "benchmarks/train_throughput.py", "--ds_config", ds_config,
                   "--config", config, "--json", str(result),
                   "--steps", "2" if args.smoke else "4", "--warmup", "1" if args.smoke else "2",
                   "--loader-batches", "10",
                   f"data.path={data}", f"model.block_size={seq}", f"train.micro_batch_size={micro}",
                   # 8 micro-steps per optimizer step, as each GPU of 8 does in the paper's recipe
                   f"train.tokens_per_step={micro * seq * ACCUMULATION}",
                   f"train.precision={setting['precision']}",
                   f"train.compile={str(setting['compile']).lower()}",
                   f"model.attn_impl={setting['attn']}", "data.num_workers=2"]
        code, output, seconds = run(command, args.timeout)
        row = dict(setting, seconds=seconds)
        if code == 0 and result.is_file():
            row.update(json.loads(result.read_text()))
        else:
            row["error"] = failure(output)
        rows.append(row)
        print(f"  train {setting}: " + (f"{row['tokens_per_s']:,.0f} tokens/s, MFU "
                                        f"{_pct(row.get('mfu'))}" if "error" not in row
                                        else f"FAILED: {row['error']}"), flush=True)
    return rows


def end_to_end(data: Path, scratch: Path, args) -> dict:
    """30 steps of trainer/main.py in two launches (20, then resumed to 30)."""
    out = scratch / "e2e_run"
    trained = RunFolder(out)
    micro, seq = (4, 128) if args.smoke else (16, 1024)
    steps = 6 if args.smoke else 30
    first = 4 if args.smoke else 20
    common = [sys.executable, "trainer/main.py",
              "--ds_config", "ds_configs/cpu.json" if args.smoke else "ds_configs/zero2.json",
              "--config", "configs/tiny.yaml" if args.smoke else "configs/ao_gpt_small.yaml",
              f"out_dir={out}", f"data.path={data}", f"model.block_size={seq}",
              f"train.micro_batch_size={micro}", f"train.tokens_per_step={micro * seq * 4}",
              "optim.warmup_steps=5", "train.log_every=1", f"checkpoint.every={first}",
              f"eval.every={first}", "eval.batches=1", "eval.num_orders=1", "logging.wandb='off'"]
    code1, output1, seconds1 = run([*common, f"train.max_steps={first}"], args.timeout)
    code2, output2, seconds2 = run([*common, f"train.max_steps={steps}"], args.timeout)
    records = read_metrics(trained.metrics_file) if trained.metrics_file.is_file() else []
    losses = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    checkpoints = trained.tags()
    result = {
        "steps": steps, "first_launch_steps": first, "tokens_per_step": micro * seq * 4,
        "exit_codes": [code1, code2], "seconds": [seconds1, seconds2],
        "first_loss": losses[0][1] if losses else None, "last_loss": losses[-1][1] if losses else None,
        "last_step": losses[-1][0] if losses else None, "checkpoints": checkpoints,
        "resumed": f"at step {first}" in output2 and "resumed from" in output2,
        "final_weights": trained.final_weights.is_file(),
    }
    result["ok"] = (code1 == code2 == 0 and result["resumed"] and result["final_weights"]
                    and result["last_step"] == steps and result["last_loss"] < result["first_loss"])
    if not result["ok"]:
        result["error"] = failure(output2 if code1 == 0 else output1)
    print(f"  e2e: {'ok' if result['ok'] else 'FAILED'}: loss {result['first_loss']} -> "
          f"{result['last_loss']}, resumed={result['resumed']}", flush=True)
    return result


def generation(scratch: Path, args) -> dict:
    result = scratch / "generation.json"
    command = [sys.executable, "benchmarks/generation_speed.py", "--json", str(result)]
    if args.smoke:
        command += ["--preset", "tiny", "--batch-size", "2", "--seq-len", "32", "--steps", "4,32"]
    else:
        command += ["--preset", "small", "--batch-size", "32", "--seq-len", "1024",
                    "--steps", "64,256,1024"]
    code, output, seconds = run(command, args.timeout * 2)
    if code or not result.is_file():
        return {"error": failure(output), "seconds": seconds}
    data = json.loads(result.read_text())
    for row in data["results"]:
        print(f"  generation S={row['steps']}: decoder {row['decoder_s']:.3f} s, encoder "
              f"{row['encoder_s']:.3f} s, {row['ratio']:.1f}x", flush=True)
    return {**data, "seconds": seconds}


def gpu_tests(args) -> dict:
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    code, output, seconds = run(command, args.timeout)
    summary = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|skipped|deselected|error)", line)]
    failed = [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))]
    print(f"  tests: {summary[-1] if summary else failure(output)}", flush=True)
    return {"exit_code": code, "summary": summary[-1] if summary else failure(output),
            "failed": failed, "seconds": seconds}


# ---- the report ------------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def environment() -> dict:
    on_gpu = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if on_gpu else f"CPU ({platform.processor() or platform.machine()})",
        "torch": torch.__version__, "cuda": torch.version.cuda if on_gpu else None,
        "cudnn": torch.backends.cudnn.version() if on_gpu else None,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "git": _git_sha(),
    }


def _git_sha() -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or None


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"# GPU report{' (smoke run: tiny sizes, not a measurement)' if report['smoke'] else ''}",
             "",
             f"{env['device']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
             f"Python {env['python']}, {env['date']}, commit {env['git']}. Made by "
             "`python benchmarks/gpu_report.py` (see its docstring for what each part runs).", ""]
    notes = report.get("notes", [])  # how a report put together from several runs was made
    for note in notes:
        lines += [f"Note: {note}", ""]
    if "train" in report:
        lines += [f"## Training throughput (one GPU, seq 1024, 16 sequences per micro-batch, "
                  f"{ACCUMULATION} micro-batches per step, the real trainer with EMA)", "",
                  "| model | ZeRO | precision | compiled | attention | tokens/s | MFU | goal | "
                  "MFU / goal | peak memory GiB | step s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in report["train"]:
            goal = GOALS.get(r["preset"])
            if "error" in r:
                lines.append(f"| {r['preset']} | {r['zero']} | {r['precision']} | {r['compile']} | "
                             f"{r['attn']} | failed: {r['error']} | | | | | |")
                continue
            ratio = f"{r['mfu'] / goal:.2f}" if goal and r.get("mfu") else "n/a"
            memory = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") else "n/a"
            lines.append(f"| {r['preset']} | {r['zero']} | {r['precision']} | {r['compile']} | "
                         f"{r['attention']} | {r['tokens_per_s']:,.0f} | {_pct(r.get('mfu'))} | "
                         f"{_pct(goal)} | {ratio} | {memory} | {r['step_s']:.3f} |")
        lines += ["", "MFU counts 6N + 12 L d T FLOPs per token (N without the embedding lookups) "
                  "against the device's dense bf16 peak.", ""]
    if "e2e" in report:
        e = report["e2e"]
        lines += ["## End to end: `trainer/main.py`, the small recipe", "",
                  f"{'OK' if e['ok'] else 'FAILED'}: {e['steps']} steps of {e['tokens_per_step']:,} "
                  f"tokens in two launches ({e['first_launch_steps']} steps, then resumed to "
                  f"{e['steps']}); loss {_num(e['first_loss'])} at step 1 -> "
                  f"{_num(e['last_loss'])} at step "
                  f"{e['last_step']}; checkpoints {', '.join(e['checkpoints'])}; resumed: "
                  f"{e['resumed']}; final weights: {e['final_weights']}; "
                  f"{sum(e['seconds']):.0f} s in all."
                  + (f" Error: {e['error']}" if "error" in e else ""), ""]
    if "generation" in report:
        g = report["generation"]
        lines += ["## Generation: KV-cache decoder vs the encoder baseline", ""]
        if "error" in g:
            lines += [f"failed: {g['error']}", ""]
        else:
            lines += [f"{g['preset']}, batch {g['batch_size']}, n = {g['seq_len']}, {g['dtype']}, "
                      "CUDA graphs on both (on a GPU).", "",
                      "| steps S | decoder s | encoder s | ratio | goal | ratio / goal |",
                      "|---|---|---|---|---|---|"]
            for r in g["results"]:
                at_goal = r["steps"] == g["seq_len"]  # the goal is set for S = n
                goal = f"{GENERATION_GOAL:.0f}x" if at_goal else ""
                versus = f"{r['ratio'] / GENERATION_GOAL:.2f}" if at_goal else ""
                lines.append(f"| {r['steps']} | {r['decoder_s']:.3f} | {r['encoder_s']:.3f} | "
                             f"{r['ratio']:.1f}x | {goal} | {versus} |")
            lines.append("")
    if "tests" in report:
        t = report["tests"]
        lines += ["## `pytest -m gpu`", "", f"{t['summary']} ({t['seconds']:.0f} s)"]
        lines += [f"- {line}" for line in t["failed"]]
        lines.append("")
    return "\n".join(lines)


def save(report: dict, out: Path) -> None:
    write_json_atomic(report, out.with_suffix(".json"))
    write_text_atomic(out, markdown(report))


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = {"smoke": args.smoke, "environment": environment()}
    previous = args.out.with_suffix(".json")
    kept = json.loads(previous.read_text()) if args.merge and previous.is_file() else {}
    report.update({part: kept[part] for part in PARTS if part in kept and part not in args.parts})
    grid = selected(train_grid(args.smoke), args.train_filter)
    print(f"GPU report on {report['environment']['device']}: {', '.join(args.parts)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="aogpt_gpu_report_") as tmp:
        scratch = Path(tmp)
        if "train" in args.parts or "e2e" in args.parts:
            data = make_data(scratch, 128 if args.smoke else 1024)
        for part in args.parts:  # the report is rewritten after each part: a cut run keeps its rows
            if part == "train":
                report["train"] = merged_rows(kept.get("train", []),
                                              measure_training(grid, data, scratch, args))
            elif part == "e2e":
                report["e2e"] = end_to_end(data, scratch, args)
            elif part == "generation":
                report["generation"] = generation(scratch, args)
            else:
                report["tests"] = gpu_tests(args)
            save(report, args.out)
    print(f"report: {args.out} and {args.out.with_suffix('.json')}")
    failed = [part for part in args.parts
              if (part == "train" and any("error" in r for r in report["train"]))
              or (part == "e2e" and not report["e2e"]["ok"])
              or (part == "generation" and "error" in report["generation"])
              or (part == "tests" and report["tests"]["exit_code"] not in (0, 5))]
    if failed:
        print(f"failed: {', '.join(failed)} (see the report)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
