"""Everything this stack claims about GPUs, measured in one command: `make gpu-report`.

    python benchmarks/gpu_report.py [--out docs/gpu-report.md] [--paper .paper] [--budget 560]
        [--only train,generation,decode,paper,e2e,tests]
    python benchmarks/gpu_report.py --smoke [--out /tmp/report.md]      (CPU, minutes: what CI runs)

On one GPU, in one 10-minute device call: the work is done most important first, each piece
with an estimate of its time, and what would not fit in --budget seconds is skipped and named
in the report:
  train       training tokens/s, MFU and peak memory of AO-GPT small and medium at seq 1024,
              through the real trainer (benchmarks/train_throughput.py: DeepSpeed engine,
              streaming loader, EMA): first the default recipe (ZeRO-1, autocast_bf16, compiled
              per block) for small and medium, then one change at a time (ZeRO-2, DeepSpeed's
              bf16, one graph for the network, micro-batch 32, 8 loader workers, eager)
  generation  the KV-cache decoder against the encoder baseline (benchmarks/generation_speed.py),
              n = 1024, batch 32, S = 64 and 1024, eager/eager and compiled/compiled
  decode      one decoder step, eager and compiled (benchmarks/decode_step.py): operations and ms
  paper       the paper's own trainer and sampler beside ours (benchmarks/paper_baseline.py), when
              --paper names a folder of its files (its repository has no licence: a git-ignored
              copy)
  e2e         `trainer/main.py` with the default small recipe for 30 steps (shorter warm-up and
              fewer tokens per step so it fits): the loss falls, a checkpoint is written, and a
              second launch resumes from it
  tests       `pytest -m gpu`: what only a GPU can check

The report opens with the goals (small >= 45% MFU, medium >= 50%, a decode call <= 0.45 ms for
small at batch 32 and n = 1024), each measured value with its ratio to the goal and to the
paper's code.

Training data is made on the spot from Python's own documentation (real English, tokenized by
data_prep/owt_to_mds.py), so the report needs no dataset and no network. Writes the markdown
report (`--out`) and the same numbers as JSON next to it; every part runs in its own process,
so one failure is reported in its row and the rest still runs. --smoke runs every part at
tiny scale on whatever device there is, to check the machinery (CI runs it on CPU); it writes to
--out or a new temporary folder, never to docs/, which holds a GPU's measurements.
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
DEFAULT_OUT = REPO / "docs" / "gpu-report.md"
PARTS = ("train", "generation", "decode", "paper", "e2e", "tests")
GOALS = {"small": 0.45, "medium": 0.50}  # MFU on one H100 (llm-foundry reaches 43-50% on A100)
GENERATION_GOAL = 65.0  # encoder / decoder time at S = n = 1024 (Eso-LMs' claim over MDMs)
DECODE_GOAL_MS = 0.45  # per decoder call, small, batch 32, n = 1024: >= 60% of an H100's HBM
ACCUMULATION = 8  # micro-steps per optimizer step in the throughput runs
# seconds each piece took on the H100 (the first report's runs; compilation included)
ESTIMATE_S = {"data": 30, "train": 45, "generation": 150, "decode": 60, "paper": 240, "e2e": 100,
              "tests": 50}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help=f"the markdown report (default {DEFAULT_OUT} on a "
                        "GPU; a new temporary folder with --smoke)")
    parser.add_argument("--paper", type=Path, help="a folder of the paper's code: its trainer and "
                        "sampler are measured beside ours (benchmarks/paper_baseline.py)")
    parser.add_argument("--budget", type=float, default=560,
                        help="seconds for the whole report: what would not fit is skipped")
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
    if args.out is None:  # a smoke run's numbers measure nothing: never over a GPU's report
        args.out = (Path(tempfile.mkdtemp(prefix="aogpt_gpu_report_smoke_")) / "gpu-report.md"
                    if args.smoke else DEFAULT_OUT)
    elif args.smoke and args.out.resolve() == DEFAULT_OUT.resolve():
        raise UsageError(f"--smoke --out {args.out}: that is the GPU's report; choose another file")
    if args.out.is_dir():
        raise UsageError(f"--out {args.out} is a folder: give a file name (e.g. report.md)")
    if args.paper is not None and not args.paper.is_dir():
        raise UsageError(f"--paper {args.paper} is not a folder of the paper's code")
    if args.budget <= 0:
        raise UsageError(f"--budget must be positive, got {args.budget}")
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
    """The training configurations measured, most important first: the default recipe for small
    and medium, then one change at a time from small's."""
    if smoke:
        return [{"preset": "tiny", "zero": 1, "precision": "fp32", "compile": False, "attn": "sdpa",
                 "scope": "block", "micro": 4, "workers": 2}]
    from aogpt.model.attention import flash_attn_func

    default = {"zero": 1, "precision": "autocast_bf16", "compile": True, "attn": "sdpa",
               "scope": "block", "micro": 16, "workers": 2}
    changes = [{"zero": 2}, {"precision": "bf16"}, {"scope": "network"}, {"micro": 32},
               {"workers": 8}, {"compile": False}]
    if flash_attn_func is not None:
        changes.insert(1, {"attn": "flash_attn"})
    grid = [{"preset": "small", **default}, {"preset": "medium", **default}]
    grid += [{"preset": "small", **default, **change} for change in changes]
    return grid + [{"preset": "medium", **default, "zero": 2}]


SETTING = ("preset", "zero", "precision", "compile", "attn", "scope", "micro", "workers")


def selected(grid: list[dict], filters: list[str]) -> list[dict]:
    """The grid rows whose settings match every KEY=VALUE filter (compared as text)."""
    wanted = [f.split("=", 1) for f in filters]
    bad = [f for f, w in zip(filters, wanted, strict=True) if len(w) != 2 or w[0] not in SETTING]
    if bad:
        raise UsageError(f"--train-filter {bad[0]}: use KEY=VALUE with KEY in {', '.join(SETTING)}")
    return [row for row in grid if all(str(row[k]) == v for k, v in wanted)]


def merged_rows(kept: list[dict], new: list[dict]) -> list[dict]:
    """The kept rows, each replaced by a new measurement of the same setting; new ones appended."""
    key = lambda row: tuple(row.get(k) for k in SETTING)  # noqa: E731
    fresh = {key(row): row for row in new}
    rows = [fresh.pop(key(row), row) for row in kept]
    return rows + list(fresh.values())


def train_row(setting: dict, data: Path, scratch: Path, args) -> dict:
    """One training configuration through benchmarks/train_throughput.py."""
    result = scratch / f"train_{len(list(scratch.glob('train_*.json')))}.json"
    seq = 128 if args.smoke else 1024
    preset = setting["preset"]
    config = "configs/tiny.yaml" if preset == "tiny" else f"configs/ao_gpt_{preset}.yaml"
    ds_config = "ds_configs/cpu.json" if args.smoke else f"ds_configs/zero{setting['zero']}.json"
    # the same tokens per optimizer step whatever the micro-batch: 8 micro-steps of 16 sequences,
    # as each GPU of 8 does in the paper's recipe
    tokens_per_step = (4 if args.smoke else 16) * seq * ACCUMULATION
    command = [sys.executable, "benchmarks/train_throughput.py", "--ds_config", ds_config,
               "--config", config, "--json", str(result),
               "--steps", "2" if args.smoke else "4", "--warmup", "1" if args.smoke else "2",
               "--loader-batches", "10",
               f"data.path={data}", f"model.block_size={seq}",
               f"train.micro_batch_size={setting['micro']}", f"train.tokens_per_step={tokens_per_step}",
               f"train.precision={setting['precision']}",
               f"train.compile={str(setting['compile']).lower()}",
               f"train.compile_scope={setting['scope']}",
               f"model.attn_impl={setting['attn']}", f"data.num_workers={setting['workers']}"]
    code, output, seconds = run(command, args.timeout)
    row = dict(setting, seconds=seconds)
    if code == 0 and result.is_file():
        row.update(json.loads(result.read_text()))
    else:
        row["error"] = failure(output)
    print(f"  train {setting}: " + (f"{row['tokens_per_s']:,.0f} tokens/s, MFU "
                                    f"{_pct(row.get('mfu'))}" if "error" not in row
                                    else f"FAILED: {row['error']}"), flush=True)
    return row


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
              f"eval.every={first}", "eval.batches=1", "eval.num_orders=1", "eval.sets=[]",
              "logging.wandb='off'"]
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
    command = [sys.executable, "benchmarks/generation_speed.py", "--json", str(result),
               "--compile", "both"]
    if args.smoke:
        command += ["--preset", "tiny", "--batch-size", "2", "--seq-len", "32", "--steps", "4,32",
                    "--compile", "off"]
    else:
        command += ["--preset", "small", "--batch-size", "32", "--seq-len", "1024",
                    "--steps", "64,1024"]
    code, output, seconds = run(command, args.timeout * 2)
    if code or not result.is_file():
        return {"error": failure(output), "seconds": seconds}
    data = json.loads(result.read_text())
    for row in data["results"]:
        print(f"  generation S={row['steps']}{' compiled' if row.get('compiled') else ''}: decoder "
              f"{row['decoder_s']:.3f} s, encoder {row['encoder_s']:.3f} s, {row['ratio']:.1f}x",
              flush=True)
    return {**data, "seconds": seconds}


def decode(scratch: Path, args) -> dict:
    """One decoder step, eager and compiled (benchmarks/decode_step.py)."""
    result = scratch / "decode.json"
    command = [sys.executable, "benchmarks/decode_step.py", "--json", str(result)]
    if args.smoke:
        command += ["--preset", "tiny", "--batch-size", "2", "--seq-len", "32", "--repeats", "2"]
    code, output, seconds = run(command, args.timeout)
    if code or not result.is_file():
        return {"error": failure(output), "seconds": seconds}
    data = json.loads(result.read_text())
    eager, compiled = data["results"]
    print(f"  decode step: eager {eager['operations']} operations {eager['step_ms']:.3f} ms, "
          f"compiled {compiled['operations']} operations {compiled['step_ms']:.3f} ms", flush=True)
    return {**data, "seconds": seconds}


def paper(scratch: Path, args) -> dict:
    """The paper's trainer and sampler beside ours (benchmarks/paper_baseline.py)."""
    result = scratch / "paper.json"
    command = [sys.executable, "benchmarks/paper_baseline.py", "--paper", str(args.paper),
               "--json", str(result)]
    command += ["--smoke", "--accumulation", "1", "--train-steps", "1"] if args.smoke else [
        "--steps", "1024", "--released-only"]
    code, output, seconds = run(command, args.timeout * 2)
    if code or not result.is_file():
        return {"error": failure(output), "seconds": seconds}
    return {**json.loads(result.read_text()), "seconds": seconds}


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


def _default_row(report: dict, preset: str) -> dict | None:
    """The measured row of the default recipe for a preset (train_grid's first two)."""
    default = train_grid(False)[0 if preset == "small" else 1]
    for row in report.get("train", []):
        if all(row.get(k) == default[k] for k in SETTING) and "error" not in row:
            return row
    return None


def _paper_rows(report: dict) -> tuple[dict | None, dict | None]:
    """The paper's compiled training row and its S = n generation row, if measured."""
    p = report.get("paper", {})
    train = next((r for r in p.get("train", []) if r["compiled"]), None)
    generation = next((r for r in p.get("generation", []) if r["steps"] == 1024), None)
    return train, generation


def goals(report: dict) -> list[str]:
    """The goals table: measured value, ratio to the goal, ratio to the paper's code."""
    paper_train, paper_generation = _paper_rows(report)
    lines = ["## Goals", "", "| goal | measured | measured / goal | ours / the paper's code |",
             "|---|---|---|---|"]
    for preset, goal in GOALS.items():
        row = _default_row(report, preset)
        if row is None or row.get("mfu") is None:
            lines.append(f"| {preset}: MFU >= {goal:.0%} | not measured | | |")
            continue
        versus = ""
        if preset == "small" and paper_train:
            versus = f"{row['tokens_per_s'] / paper_train['paper_tokens_per_s']:.2f}x tokens/s"
        lines.append(f"| {preset}: MFU >= {goal:.0%} | {row['mfu']:.1%} ({row['tokens_per_s']:,.0f} "
                     f"tokens/s) | {row['mfu'] / goal:.2f} | {versus} |")
    g = report.get("generation", {})
    at_n = [r for r in g.get("results", []) if r["steps"] == g.get("seq_len") and r.get("compiled")]
    if at_n and "decoder_ms_per_call" in at_n[0]:
        ms = at_n[0]["decoder_ms_per_call"]
        floor = g.get("hbm_floor_ms")
        of_floor = f" ({floor / ms:.0%} of the memory bandwidth)" if floor else ""
        versus = (f"{paper_generation['paper']['generate_s'] / paper_generation['ours']['generate_s']:.2f}x"
                  " generation time" if paper_generation else "")
        lines.append(f"| decode: <= {DECODE_GOAL_MS} ms per call (small, batch {g['batch_size']}, "
                     f"n = {g['seq_len']}) | {ms:.3f} ms{of_floor} | {DECODE_GOAL_MS / ms:.2f} | "
                     f"{versus} |")
    else:
        lines.append(f"| decode: <= {DECODE_GOAL_MS} ms per call | not measured | | |")
    lines += ["", "measured / goal above 1 meets the goal (for the decode call: goal / measured)."]
    return lines + [""]


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
    for skipped in report.get("skipped", []):
        lines += [f"Skipped, over the time budget: {skipped}", ""]
    lines += goals(report)
    if "train" in report:
        lines += [f"## Training throughput (one GPU, seq 1024, {16 * ACCUMULATION} sequences per "
                  "step, the real trainer with EMA)", "",
                  "| model | ZeRO | precision | compiled | scope | attention | micro | workers | "
                  "tokens/s | MFU | goal | MFU / goal | peak memory GiB | step s | loader / step |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in report["train"]:
            goal = GOALS.get(r["preset"])
            settings = (f"| {r['preset']} | {r['zero']} | {r['precision']} | {r['compile']} | "
                        f"{r.get('scope', 'block')} | {r.get('attention', r['attn'])} | "
                        f"{r.get('micro', r.get('micro_batch_size', 16))} | {r.get('workers', 2)} |")
            if "error" in r:
                lines.append(f"{settings} failed: {r['error']} | | | | | | |")
                continue
            ratio = f"{r['mfu'] / goal:.2f}" if goal and r.get("mfu") else "n/a"
            memory = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") else "n/a"
            loader = f"{r['loader_ratio']:.1f}x" if r.get("loader_ratio") else "n/a"
            lines.append(f"{settings} {r['tokens_per_s']:,.0f} | {_pct(r.get('mfu'))} | "
                         f"{_pct(goal)} | {ratio} | {memory} | {r['step_s']:.3f} | {loader} |")
        lines += ["", "MFU counts 6N + 12 L d T FLOPs per token (N without the embedding lookups) "
                  "against the device's dense bf16 peak. loader / step: the loader alone against "
                  "what a step consumes (>= 10x needed).", ""]
    for part, title, body in (
            ("generation", "Generation: KV-cache decoder vs the encoder baseline", generation_lines),
            ("decode", "One decoder step (`decode_step.py`)", decode_lines),
            ("paper", "The paper's code beside ours (`paper_baseline.py`)", paper_lines)):
        if part in report:
            failed = "error" in report[part]
            lines += [f"## {title}", "", *([f"failed: {report[part]['error']}", ""] if failed
                                           else body(report[part]))]
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
    if "tests" in report:
        t = report["tests"]
        lines += ["## `pytest -m gpu`", "", f"{t['summary']} ({t['seconds']:.0f} s)"]
        lines += [f"- {line}" for line in t["failed"]]
        lines.append("")
    return "\n".join(lines)


def generation_lines(g: dict) -> list[str]:
    floor = g.get("hbm_floor_ms")
    lines = [f"{g['preset']}, batch {g['batch_size']}, n = {g['seq_len']}, {g['dtype']}, CUDA "
             "graphs on both (on a GPU)"
             + (f"; memory floor of a decoder call {floor:.3f} ms" if floor else "") + ".", "",
             "| steps S | compiled | decoder s | encoder s | ratio | ms per decoder call | goal | "
             "ratio / goal |", "|---|---|---|---|---|---|---|---|"]
    for r in g["results"]:
        at_goal = r["steps"] == g["seq_len"]  # the goal is set for S = n
        goal = f"{GENERATION_GOAL:.0f}x" if at_goal else ""
        versus = f"{r['ratio'] / GENERATION_GOAL:.2f}" if at_goal else ""
        ms = r.get("decoder_ms_per_call")
        lines.append(f"| {r['steps']} | {r.get('compiled', False)} | {r['decoder_s']:.3f} | "
                     f"{r['encoder_s']:.3f} | {r['ratio']:.1f}x | "
                     f"{'' if ms is None else f'{ms:.3f}'} | {goal} | {versus} |")
    return lines + [""]


def decode_lines(d: dict) -> list[str]:
    return [f"{d['preset']}, batch {d['batch_size']}, n = {d['seq_len']}, {d['known']} known, "
            f"{d['targets']} drawn, {d['dtype']}.", "", "| | operations | ms per step |",
            "|---|---|---|",
            *[f"| {'compiled' if r['compiled'] else 'eager'} | {r['operations']} | "
              f"{r['step_ms']:.3f} |" for r in d["results"]], ""]


def paper_lines(p: dict) -> list[str]:
    lines = []
    if p.get("train"):
        lines += ["| training loop | paper tokens/s | ours tokens/s | ours / paper |", "|---|---|---|---|"]
        lines += [f"| {'compiled' if r['compiled'] else 'eager'} | {r['paper_tokens_per_s']:,.0f} | "
                  f"{r['ours_tokens_per_s']:,.0f} | {r['ratio']:.2f}x |" for r in p["train"]]
        lines.append("")
    if p.get("generation"):
        lines += ["| sampling, S | samples | paper s (whole process / generation) | ours s | "
                  "paper / ours |", "|---|---|---|---|---|"]
        for r in p["generation"]:
            lines.append(f"| {r['steps']} | {r['samples']} | {r['paper']['process_s']:.1f} / "
                         f"{r['paper']['generate_s']:.1f} | {r['ours']['process_s']:.1f} / "
                         f"{r['ours']['generate_s']:.1f} | {r['ratio_process']:.2f}x / "
                         f"{r['ratio_generate']:.2f}x |")
        lines.append("")
    return lines


def save(report: dict, out: Path) -> None:
    write_json_atomic(report, out.with_suffix(".json"))
    write_text_atomic(out, markdown(report))


def schedule(args, grid: list[dict]) -> list[tuple[str, dict | None]]:
    """(part, training setting or None) in the order they run: most important first."""
    train = [("train", setting) for setting in grid] if "train" in args.parts else []
    rest = [(part, None) for part in ("generation", "decode", "paper") if part in args.parts
            and (part != "paper" or args.paper is not None)]
    tail = [(part, None) for part in ("e2e", "tests") if part in args.parts]
    return train[:2] + rest + train[2:] + tail


@cli_entry
def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    budget = args.budget if not args.smoke else float("inf")  # the estimates are a GPU's
    report = {"smoke": args.smoke, "environment": environment(), "skipped": []}
    previous = args.out.with_suffix(".json")
    kept = json.loads(previous.read_text()) if args.merge and previous.is_file() else {}
    report.update({part: kept[part] for part in PARTS if part in kept and part not in args.parts})
    grid = selected(train_grid(args.smoke), args.train_filter)
    print(f"GPU report on {report['environment']['device']}: {', '.join(args.parts)}, budget "
          f"{budget:.0f} s; writing {args.out}", flush=True)
    with tempfile.TemporaryDirectory(prefix="aogpt_gpu_report_") as tmp:
        scratch = Path(tmp)
        if "train" in args.parts or "e2e" in args.parts:
            data = make_data(scratch, 128 if args.smoke else 1024)
        if "train" in args.parts:
            report["train"] = list(kept.get("train", []))
        for part, setting in schedule(args, grid):
            elapsed = time.perf_counter() - started
            if elapsed + ESTIMATE_S[part] > budget:
                what = f"train {setting}" if setting else part
                report["skipped"].append(f"{what} (~{ESTIMATE_S[part]} s; {elapsed:.0f} s of "
                                         f"{budget:.0f} s used)")
                print(f"  skipped, over the budget: {what}", flush=True)
                continue
            if part == "train":
                report["train"] = merged_rows(report["train"], [train_row(setting, data, scratch, args)])
            elif part == "e2e":
                report["e2e"] = end_to_end(data, scratch, args)
            elif part == "tests":
                report["tests"] = gpu_tests(args)
            else:
                report[part] = {"generation": generation, "decode": decode, "paper": paper}[part](
                    scratch, args)
            save(report, args.out)  # after each piece: a cut run keeps what it measured
    report["seconds"] = time.perf_counter() - started
    save(report, args.out)
    print(f"report: {args.out} and {args.out.with_suffix('.json')} ({report['seconds']:.0f} s)")
    failed = [part for part in args.parts if part in report and (
        (part == "train" and any("error" in r for r in report["train"]))
        or (part == "e2e" and not report["e2e"]["ok"])
        or (part in ("generation", "decode", "paper") and "error" in report[part])
        or (part == "tests" and report["tests"]["exit_code"] not in (0, 5)))]
    if failed:
        print(f"failed: {', '.join(failed)} (see the report)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
