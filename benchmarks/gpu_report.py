"""Everything this stack claims about GPUs, checked and measured in one command: `make gpu-report`.

    python benchmarks/gpu_report.py [--out docs/gpu-report.md] [--paper .paper] [--budget 560]
        [--only checks,train,decode,paper,generation,e2e] [--train-filter KEY=VALUE] [--merge]
    python benchmarks/gpu_report.py --dry-run      (any machine: the plan, its estimates, its fit)
    python benchmarks/gpu_report.py --smoke [--out /tmp/report.md]      (CPU, minutes: what CI runs)

One GPU, one device call of 10 minutes: the report is a plan of items in order of value, each
with an estimate of its seconds on an H100, and it must fit --budget (560 s: the call's 600 less
the wheels' install and the interpreter's start). In order:

  checks      `pytest -m gpu`, the correctness checks first (tests/model/test_gpu_checks.py:
              the order hash and the shuffle bitwise as on a CPU, eager and compiled; the
              float64 inverse CDF under Triton; the head's fp32-accumulating matmul against
              float64; the compiled sampler replayed as CUDA graphs against eager steps;
              tests/trainer/test_gpu_syncs.py: training steps 2..k under
              torch.cuda.set_sync_debug_mode("error") in autocast_bf16 and bf16), then every
              other GPU test
  train small training tokens/s, MFU and peak memory of AO-GPT small at seq 1024 with the default
              recipe (ZeRO-1, autocast_bf16, compiled per block) through the real trainer
              (benchmarks/train_throughput.py: DeepSpeed engine, streaming loader, EMA), on data
              made on the spot from Python's own documentation (real English, data_prep)
  decode      one decoder step as trainer/sample.py runs it (replayed as a CUDA graph, and
              compiled too for long runs) beside eager and compiled steps
              (benchmarks/decode_step.py): kernels per step and ms, the numbers that decide
              sample.py's --compile auto
  paper       the paper's own trainer and sampler beside ours (benchmarks/paper_baseline.py), its
              code read from --paper (by default the git-ignored .paper/ of this checkout: its
              repository has no licence): both bare training steps compiled (each side's fastest
              on a GPU), and one generation of 32 x 1024 tokens at S = 1024 by each in a fresh
              process, compilation apart
  train medium  the default recipe for medium
and then, where the budget leaves room, the rest, named in the plan when it does not fit:
  generation  the KV-cache decoder against the encoder baseline (benchmarks/generation_speed.py),
              batch 32, n = 1024, S = 64 and 1024, eager/eager and compiled/compiled
  e2e         `trainer/main.py` with the small recipe for 30 steps in two launches (the loss falls,
              a checkpoint is written, the second launch resumes from it)
  train ...   one change at a time from small's default recipe (ZeRO-2, DeepSpeed's bf16, one
              graph for the network, micro-batch 32, 8 loader workers, eager), medium with ZeRO-2

--dry-run prints the plan with its estimates and refuses one that would drop a promised item
(the checks, small, decode, the paper side, medium; with --only, every item named) or that has no
paper checkout to read; the items it leaves to a second call are named with the command that
measures them (--only ... --merge). A run checks the same before it starts. While it runs, an
item whose estimate no longer fits what is left of the budget is skipped and named, and no item
may run past the budget (its process is ended there).

Every row is written the moment it is measured: the report (markdown, and the same numbers as
JSON next to it) is rewritten after each item, and while a benchmark runs its rows are read from
its JSON as it writes them (benchmarks/results.py), and the GPU tests' results from pytest's
output, line by line. A call cut short keeps every finished row. Every item runs in its own
process, so one failure is reported in its row and the rest still runs. --smoke runs every item
at tiny scale on whatever device there is, without a budget, to check the machinery (CI runs it
on CPU); it writes to --out or a new temporary folder, never to docs/, which holds a GPU's
measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from results import EXCEPTION_LINE, why

from aogpt import UsageError, cli_entry
from aogpt.data_prep.corpora import python_docs
from aogpt.files import write_json_atomic, write_text_atomic
from aogpt.run_folder import RunFolder
from aogpt.trainer.metrics import read_metrics

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "gpu-report.md"
DEFAULT_PAPER = REPO / ".paper"
PAPER_FILES = ("model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm.py", "ema.py",
               "model_AOGPT_generate.py", "catsample.py")  # paper_baseline.py's PAPER_FILES
PARTS = ("checks", "train", "decode", "paper", "generation", "e2e")
GOALS = {"small": 0.45, "medium": 0.50}  # MFU on one H100 (llm-foundry reaches 43-50% on A100)
GENERATION_GOAL = 65.0  # encoder / decoder time at S = n = 1024 (Eso-LMs' claim over MDMs)
DECODE_GOAL_MS = 0.45  # per decoder call, small, batch 32, n = 1024: >= 60% of an H100's HBM
ACCUMULATION = 8  # micro-steps per optimizer step in the throughput runs
# What the report's commands import (setup.py's requirements that a GPU machine's image may lack:
# its first H200 run lost its training rows to a missing orjson)
NEEDED_MODULES = ("deepspeed", "streaming", "orjson", "xxhash", "zstd", "yaml", "tiktoken",
                  "transformers", "pytest")
CHECK_FILES = ("tests/model/test_gpu_checks.py", "tests/trainer/test_gpu_syncs.py")
# Seconds on one H100, compilation included: the first report's runs (data 30, a training row
# 45, e2e 94, generation 150, the 8 GPU tests 44) and, for what is new since, the parts they are
# made of (a trainer launch ~30 s with its compilation, an inductor compile of a decode step or
# of the order sampler ~10-30 s, the paper's compiled model ~40 s): the new checks ~105 s more.
# The report shows each item's real seconds beside its estimate: update these from it.
ESTIMATE_S = {"checks": 150, "data": 30, "train": 45, "decode": 70, "paper train": 90,
              "paper generation": 130, "generation": 150, "e2e": 100}
POLL_S = 1.0  # how often a running item's rows are read back


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help=f"the markdown report (default {DEFAULT_OUT} on a "
                        "GPU; a new temporary folder with --smoke)")
    parser.add_argument("--paper", type=Path, default=DEFAULT_PAPER,
                        help="a folder of the paper's code (github.com/scxue/AO-GPT-MDM), whose "
                             "trainer and sampler are measured beside ours (default .paper)")
    parser.add_argument("--budget", type=float, default=560,
                        help="seconds for the whole report (default 560: a 10-minute device call)")
    parser.add_argument("--only", help=f"comma list of {', '.join(PARTS)} (default: all, the "
                        "ones that do not fit the budget named and left out)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and its estimates, and whether it fits; run nothing")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, any device (CI)")
    parser.add_argument("--merge", action="store_true",
                        help="keep what is not measured now from the report's existing JSON")
    parser.add_argument("--train-filter", action="append", default=[], metavar="KEY=VALUE",
                        help="measure only the training rows with this setting, e.g. "
                             "precision=autocast_bf16 (repeatable; with --merge the others stay)")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in (args.only or ",".join(PARTS)).split(",") if p.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        raise UsageError(f"--only: unknown part(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(PARTS)}")
    if args.budget <= 0:
        raise UsageError(f"--budget must be positive, got {args.budget}")
    args.paper = args.paper.resolve()  # the items run from the repository's root
    if args.dry_run:
        return args
    if not args.smoke and not torch.cuda.is_available():
        raise UsageError("no CUDA GPU here: the report measures GPUs (use --smoke to check it on "
                         "CPU, --dry-run to see its plan)")
    if args.out is None:  # a smoke run's numbers measure nothing: never over a GPU's report
        args.out = (Path(tempfile.mkdtemp(prefix="aogpt_gpu_report_smoke_")) / "gpu-report.md"
                    if args.smoke else DEFAULT_OUT)
    elif args.smoke and args.out.resolve() == DEFAULT_OUT.resolve():
        raise UsageError(f"--smoke --out {args.out}: that is the GPU's report; choose another file")
    if args.out.is_dir():
        raise UsageError(f"--out {args.out} is a folder: give a file name (e.g. report.md)")
    return args


def paper_problem(folder: Path) -> str | None:
    """Why `folder` cannot serve as the paper's code, or None."""
    if not folder.is_dir():
        return f"--paper {folder} is not a folder"
    missing = [name for name in PAPER_FILES if not (folder / name).is_file()]
    return f"--paper {folder} lacks {', '.join(missing)}" if missing else None


PAPER_HOW = ("export its files there: git -C AO-GPT-MDM show HEAD:FILE > .paper/FILE for "
             f"{', '.join(PAPER_FILES)} (github.com/scxue/AO-GPT-MDM; never commit them), or "
             "leave it out with --only")


# ---- running a command, reading its rows as they come ------------------------------------------


def run(command: list[str], timeout: float, env: dict | None = None,
        progress: Callable[[str], None] | None = None) -> tuple[int, str, float]:
    """Exit status, output (stdout + stderr) and seconds of a command run from the repo root.
    `progress(output so far)` is called every POLL_S while it runs, and once at its end. Past
    `timeout` seconds its whole process group is ended (status 124): what it wrote stays."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as sink:
        process = subprocess.Popen(command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                                   text=True, env={**os.environ, **(env or {})},
                                   start_new_session=True)
        code = None
        while code is None:
            try:
                code = process.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                if time.perf_counter() - start > timeout:
                    with contextlib.suppress(ProcessLookupError):  # it may just have ended
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    code = 124
            sink.seek(0)
            output = sink.read()
            if progress is not None:
                progress(output)
    if code == 124:
        output += f"\n(timed out after {timeout:.0f} s)"
    return code, output, time.perf_counter() - start


def failure(output: str) -> str:
    """The line of a failed run that says why: its last line naming an exception with a message,
    else its last error line, else its last line."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|Error|timed out", line)]
    named = why(output)
    return named if EXCEPTION_LINE.search(named) else (errors or lines or ["no output"])[-1][:300]


def read_rows(path: Path) -> dict | None:
    """A benchmark's JSON as it stands (benchmarks/results.py writes it whole, atomically)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def benchmark(command: list[str], result: Path, timeout: float,
              on_rows: Callable[[dict], None]) -> dict:
    """Runs a benchmark that writes `result` after every row; `on_rows(its data)` whenever the
    file changes. Its data at the end, with "seconds", and "error" if it failed or was cut (the
    rows it finished stay)."""
    seen = [None]

    def progress(_output: str) -> None:
        stamp = result.stat().st_mtime_ns if result.is_file() else None
        if stamp != seen[0] and (data := read_rows(result)) is not None:
            seen[0] = stamp
            on_rows(data)

    code, output, seconds = run(command, timeout, progress=progress)
    data = read_rows(result) or {}
    data["seconds"] = seconds
    if code or not data.get("complete"):
        data["error"] = failure(output)
    return data


# ---- the items ---------------------------------------------------------------------------------


@dataclass
class Item:
    part: str  # the --only word that selects it
    name: str
    estimate_s: float
    promised: bool  # the report is refused if it does not fit
    run: Callable[[Report, float], None]  # (report, seconds it may take)
    measured: Callable[[dict], bool]  # whether a report's JSON holds it, without an error


@dataclass
class Report:
    args: argparse.Namespace
    scratch: Path
    data: dict = field(default_factory=dict)

    def save(self) -> None:
        write_json_atomic(self.data, self.args.out.with_suffix(".json"))
        write_text_atomic(self.args.out, markdown(self.data))


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


def describe(setting: dict) -> str:
    default = train_grid(False)[0]
    changed = [f"{k} {setting[k]}" for k in SETTING[1:] if setting[k] != default[k]]
    return f"train {setting['preset']}" + (f" ({', '.join(changed)})" if changed
                                           else " (default recipe)")


def checks(report: Report, timeout: float) -> None:
    """`pytest -m gpu`, the correctness checks first; each test's outcome as pytest prints it,
    and for each failure or module that could not be imported the line that says why. A module
    that cannot be imported there (the machine lacks a test-only package) costs its own tests,
    not every check's."""
    command = [sys.executable, "-m", "pytest", "-v", "-rfE", "--continue-on-collection-errors",
               "-m", "gpu", "-p", "no:cacheprovider", *CHECK_FILES, "tests"]
    outcome = re.compile(r"^(tests/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")
    data = report.data["checks"] = {"tests": []}

    def progress(output: str) -> None:
        found = map(outcome.match, output.splitlines())
        tests = [{"test": m[1], "outcome": m[2]} for m in found if m]
        if len(tests) != len(data["tests"]):
            data["tests"] = tests
            report.save()

    code, output, seconds = run(command, timeout, progress=progress)
    summary = [line.strip("= ") for line in output.splitlines()
               if re.search(r"\d+ (passed|failed|skipped|deselected|error)", line)]
    reasons = re.findall(r"^(?:FAILED|ERROR) (tests/\S+) - (.+)$", output, re.MULTILINE)
    data.update(exit_code=code, seconds=seconds,
                summary=summary[-1] if summary else failure(output),
                reasons={test: reason[:300] for test, reason in reasons})
    if code not in (0, 5):  # 5: nothing collected
        data["error"] = failure(output) if code == 124 else data["summary"]
    print(f"  checks: {data['summary']}", flush=True)


def make_data(report: Report, timeout: float) -> None:
    """A pretraining folder (train + val) of Python's documentation, tokenized by owt_to_mds.py."""
    seq_len = 128 if report.args.smoke else 1024
    source = python_docs(report.scratch, copies=3)
    out = report.scratch / f"data_{seq_len}"
    code, output, seconds = run([sys.executable, "data_prep/owt_to_mds.py", "--out", str(out),
                                 "--source", str(source), "--seq-len", str(seq_len),
                                 "--val-fraction", "0.05",
                                 "--workers", str(min(8, os.cpu_count() or 1))], timeout)
    report.data["data"] = ({"path": str(out), "seconds": seconds} if code == 0 else
                           {"error": f"data_prep/owt_to_mds.py failed: {failure(output)}",
                            "seconds": seconds})


def train_row(setting: dict) -> Callable[[Report, float], None]:
    def measure(report: Report, timeout: float) -> None:
        data = report.data.get("data", {})
        row = dict(setting)
        if "path" not in data:
            row["error"] = f"no training data ({data.get('error', 'not made')})"
        else:
            row.update(train_throughput(setting, Path(data["path"]), report, timeout))
        report.data["train"] = merged_rows(report.data.get("train", []), [row])
        print(f"  {describe(setting)}: " + (
            f"{row['tokens_per_s']:,.0f} tokens/s, MFU {_pct(row.get('mfu'))}"
            if "error" not in row else f"FAILED: {row['error']}"), flush=True)

    return measure


def train_throughput(setting: dict, data: Path, report: Report, timeout: float) -> dict:
    args = report.args
    result = report.scratch / f"train_{len(list(report.scratch.glob('train_*.json')))}.json"
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
               f"train.micro_batch_size={setting['micro']}",
               f"train.tokens_per_step={tokens_per_step}",
               f"train.precision={setting['precision']}",
               f"train.compile={str(setting['compile']).lower()}",
               f"train.compile_scope={setting['scope']}",
               f"model.attn_impl={setting['attn']}", f"data.num_workers={setting['workers']}"]
    code, output, seconds = run(command, timeout)
    if code == 0 and result.is_file():
        return {**json.loads(result.read_text()), "seconds": seconds}
    return {"error": failure(output), "seconds": seconds}


def decode(report: Report, timeout: float) -> None:
    """One decoder step in each configuration (benchmarks/decode_step.py)."""
    result = report.scratch / "decode.json"
    command = [sys.executable, "benchmarks/decode_step.py", "--json", str(result)]
    if report.args.smoke:
        command += ["--preset", "tiny", "--batch-size", "2", "--seq-len", "32", "--repeats", "2"]
    data = benchmark(command, result, timeout, lambda rows: _keep(report, "decode", rows))
    _keep(report, "decode", data)
    for row in data.get("results", []):
        print(f"  decode step, {row['name']}: {row['kernels']} kernels, {row['step_ms']:.3f} ms "
              f"(warm-up {row['warm_up_s']:.1f} s)", flush=True)


def paper_part(part: str) -> Callable[[Report, float], None]:
    """The paper's trainer ("train") or sampler ("generation") beside ours (paper_baseline.py)."""
    def measure(report: Report, timeout: float) -> None:
        args = report.args
        result = report.scratch / f"paper_{part}.json"
        command = [sys.executable, "benchmarks/paper_baseline.py", "--paper", str(args.paper),
                   "--part", part, "--json", str(result)]
        if args.smoke:
            command += ["--smoke", "--accumulation", "1", "--train-steps", "1"]
        else:  # each side's fastest configuration on a GPU only, to save the time of the others
            command += ["--train-modes", "compiled"] if part == "train" else [
                "--steps", "1024", "--released-only"]
        paper = report.data.setdefault("paper", {})

        def keep(rows: dict) -> None:
            paper.update({key: rows[key] for key in (part, "train_best") if key in rows})
            paper[f"{part}_seconds"] = rows.get("seconds")
            paper.pop(f"{part}_error", None)
            if "error" in rows:
                paper[f"{part}_error"] = rows["error"]
            report.save()

        data = benchmark(command, result, timeout, keep)
        keep(data)
        for row in data.get("train", []):
            print(f"  paper's trainer, {'compiled' if row['compiled'] else 'eager'}: ours / "
                  f"paper's {row['ratio']:.2f}x tokens/s", flush=True)
        for row in data.get("generation", []):
            print(f"  paper's sampler, S = {row['steps']}: paper's / ours "
                  f"{row['ratio_generate']:.2f}x generation", flush=True)
        if "error" in data:
            print(f"  paper {part}: FAILED: {data['error']}", flush=True)

    return measure


def generation(report: Report, timeout: float) -> None:
    """The KV-cache decoder against the encoder baseline (benchmarks/generation_speed.py)."""
    result = report.scratch / "generation.json"
    command = [sys.executable, "benchmarks/generation_speed.py", "--json", str(result)]
    if report.args.smoke:
        command += ["--preset", "tiny", "--batch-size", "2", "--seq-len", "32", "--steps", "4,32",
                    "--compile", "off"]
    else:
        command += ["--preset", "small", "--batch-size", "32", "--seq-len", "1024",
                    "--steps", "64,1024", "--compile", "both"]
    data = benchmark(command, result, timeout, lambda rows: _keep(report, "generation", rows))
    _keep(report, "generation", data)
    for row in data.get("results", []):
        print(f"  generation S={row['steps']}{' compiled' if row.get('compiled') else ''}: decoder "
              f"{row['decoder_s']:.3f} s, encoder {row['encoder_s']:.3f} s, {row['ratio']:.1f}x",
              flush=True)


def end_to_end(report: Report, timeout: float) -> None:
    """30 steps of trainer/main.py in two launches (20, then resumed to 30)."""
    args, data = report.args, report.data.get("data", {})
    if "path" not in data:
        report.data["e2e"] = {"ok": False, "error": f"no training data ({data.get('error')})"}
        return
    out = report.scratch / "e2e_run"
    trained = RunFolder(out)
    micro, seq = (4, 128) if args.smoke else (16, 1024)
    steps = 6 if args.smoke else 30
    first = 4 if args.smoke else 20
    common = [sys.executable, "trainer/main.py",
              "--ds_config", "ds_configs/cpu.json" if args.smoke else "ds_configs/zero2.json",
              "--config", "configs/tiny.yaml" if args.smoke else "configs/ao_gpt_small.yaml",
              f"out_dir={out}", f"data.path={data['path']}", f"model.block_size={seq}",
              f"train.micro_batch_size={micro}", f"train.tokens_per_step={micro * seq * 4}",
              "optim.warmup_steps=5", "train.log_every=1", f"checkpoint.every={first}",
              f"eval.every={first}", "eval.batches=1", "eval.num_orders=1", "eval.sets=[]",
              "logging.wandb='off'"]
    start = time.perf_counter()
    code1, output1, seconds1 = run([*common, f"train.max_steps={first}"], timeout)
    code2, output2, seconds2 = run([*common, f"train.max_steps={steps}"],
                                   timeout - (time.perf_counter() - start))
    records = read_metrics(trained.metrics_file) if trained.metrics_file.is_file() else []
    losses = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    result = {
        "steps": steps, "first_launch_steps": first, "tokens_per_step": micro * seq * 4,
        "exit_codes": [code1, code2], "seconds": [seconds1, seconds2],
        "first_loss": losses[0][1] if losses else None,
        "last_loss": losses[-1][1] if losses else None,
        "last_step": losses[-1][0] if losses else None, "checkpoints": trained.tags(),
        "resumed": f"at step {first}" in output2 and "resumed from" in output2,
        "final_weights": trained.final_weights.is_file(),
    }
    result["ok"] = (code1 == code2 == 0 and result["resumed"] and result["final_weights"]
                    and result["last_step"] == steps and result["last_loss"] < result["first_loss"])
    if not result["ok"]:
        result["error"] = failure(output2 if code1 == 0 else output1)
    report.data["e2e"] = result
    print(f"  e2e: {'ok' if result['ok'] else 'FAILED'}: loss {result['first_loss']} -> "
          f"{result['last_loss']}, resumed={result['resumed']}", flush=True)


def _keep(report: Report, part: str, data: dict) -> None:
    report.data[part] = data
    report.save()


# ---- the plan ----------------------------------------------------------------------------------


def _holds(part: str) -> Callable[[dict], bool]:
    return lambda report: part in report and not report[part].get("error")


def _holds_row(setting: dict) -> Callable[[dict], bool]:
    return lambda report: any(all(row.get(k) == setting[k] for k in SETTING) and "error" not in row
                              for row in report.get("train", []))


def _holds_paper(part: str) -> Callable[[dict], bool]:
    return lambda report: (bool(report.get("paper", {}).get(part))
                           and f"{part}_error" not in report["paper"])


def plan(args: argparse.Namespace, existing: dict) -> list[Item]:
    """Every item the selected parts hold, in order of value: the checks; small's training, the
    decode step, the paper side and medium's training (promised: the plan must fit them); then
    the rest. With --only, every item of the parts named is promised but the training grid
    beyond the two default rows (its rows are measured as the budget allows and the rest named
    for a --merge call: `--only train` runs, where refusing it would cost a device call), and
    with --train-filter every training row it selects. With --merge (and no --only), the items
    `existing` (the report's JSON) holds are left out, save the rows --train-filter names: a
    second call measures the rest."""
    chosen, filtered = args.only is not None, bool(args.train_filter)
    grid = selected(train_grid(args.smoke), args.train_filter)
    first, rest = grid[:1 if args.smoke else 2], grid[1 if args.smoke else 2:]
    train = lambda settings, promised: [  # noqa: E731
        Item("train", describe(s), ESTIMATE_S["train"], promised or filtered, train_row(s),
             _holds_row(s)) for s in settings]
    items = [Item("checks", "checks: pytest -m gpu, correctness first", ESTIMATE_S["checks"], True,
                  checks, _holds("checks"))]
    items += train(first[:1], True)
    items += [Item("decode", "decode: one step as sample.py runs it, and the others",
                   ESTIMATE_S["decode"], True, decode, _holds("decode")),
              Item("paper", "paper: both trainers' bare steps, compiled", ESTIMATE_S["paper train"],
                   True, paper_part("train"), _holds_paper("train")),
              Item("paper", "paper: both samplers, fresh processes (32 x 1024 tokens, S = 1024)",
                   ESTIMATE_S["paper generation"], True, paper_part("generation"),
                   _holds_paper("generation"))]
    items += train(first[1:], True)
    items += [Item("generation", "generation: decoder vs encoder, S = 64 and 1024",
                   ESTIMATE_S["generation"], chosen, generation, _holds("generation")),
              Item("e2e", "e2e: trainer/main.py, 30 steps in two launches", ESTIMATE_S["e2e"],
                   chosen, end_to_end, lambda report: report.get("e2e", {}).get("ok", False))]
    items += train(rest, False)
    items = [item for item in items if item.part in args.parts]
    if args.merge and not chosen:
        items = [item for item in items
                 if not item.measured(existing) or (filtered and item.part == "train")]
    if any(item.part in ("train", "e2e") for item in items):  # before the first that needs it
        at = next(n for n, item in enumerate(items) if item.part in ("train", "e2e"))
        items.insert(at, Item("data", "data: Python's documentation, tokenized",
                              ESTIMATE_S["data"], True, make_data, lambda report: False))
    return items


def fit(items: list[Item], budget: float) -> tuple[list[Item], list[Item]]:
    """The items that fit the budget in plan order, and those left out."""
    kept, left, total = [], [], 0.0
    for item in items:
        if total + item.estimate_s <= budget:
            kept.append(item)
            total += item.estimate_s
        else:
            left.append(item)
    return kept, left


def plan_lines(items: list[Item], kept: list[Item], left: list[Item], budget: float) -> list[str]:
    total = sum(item.estimate_s for item in kept)
    lines = [f"plan: {len(kept)} items, ~{total:.0f} s of a {budget:.0f} s budget "
             "(estimates: seconds on one H100, compilation included)",
             f"  {'s':>5} {'by':>5}  item"]
    elapsed = 0.0
    for item in kept:
        elapsed += item.estimate_s
        lines.append(f"  {item.estimate_s:>5.0f} {elapsed:>5.0f}  {item.name}")
    if left:
        lines.append("left for a second call (make gpu-report REPORT_FLAGS=--merge measures what "
                     "the report lacks):")
        lines += [f"  {item.estimate_s:>5.0f}        {item.name}" for item in left]
    return lines


def check_plan(args: argparse.Namespace, kept: list[Item], left: list[Item]) -> None:
    """Refuses a plan that would drop a promised item, or read the paper's code from nowhere."""
    dropped = [item for item in left if item.promised]
    if dropped:
        raise UsageError(
            f"the plan does not fit --budget {args.budget:.0f} s: it would drop "
            f"{'; '.join(f'{i.name} (~{i.estimate_s:.0f} s)' for i in dropped)}; raise --budget "
            "or name fewer parts with --only")
    missing = [name for name in NEEDED_MODULES if importlib.util.find_spec(name) is None]
    if missing and not args.dry_run:  # found now, not after minutes of device time
        raise UsageError(
            f"this machine lacks the Python package(s) {', '.join(missing)} that the report's "
            "commands import: add their wheels to the folder you install from (on the lent GPU "
            "machine, .whl: pip download --no-deps --only-binary=:all: --python-version 3.12 "
            f"--platform manylinux2014_x86_64 -d .whl {' '.join(missing)})")
    problem = paper_problem(args.paper) if any(i.part == "paper" for i in kept) else None
    if problem and not args.dry_run:
        raise UsageError(f"{problem}: the paper's trainer and sampler cannot be measured; "
                         + PAPER_HOW)


# ---- the report --------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def environment() -> dict:
    on_gpu = torch.cuda.is_available()
    return {
        "device": (torch.cuda.get_device_name() if on_gpu
                   else f"CPU ({platform.processor() or platform.machine()})"),
        "torch": torch.__version__, "cuda": torch.version.cuda if on_gpu else None,
        "cudnn": torch.backends.cudnn.version() if on_gpu else None,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "git": _git_sha(),
    }


def _git_sha() -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True)
    return done.stdout.strip() or None


def _default_row(report: dict, preset: str) -> dict | None:
    """The measured row of the default recipe for a preset (train_grid's first two)."""
    default = train_grid(False)[0 if preset == "small" else 1]
    for row in report.get("train", []):
        if all(row.get(k) == default[k] for k in SETTING) and "error" not in row:
            return row
    return None


def _as_sample_py(report: dict) -> dict | None:
    """decode_step's fastest row of a step as trainer/sample.py runs it on a GPU (graphs, and
    compiled too for long runs), without a fall-back to eager."""
    rows = [r for r in report.get("decode", {}).get("results", [])
            if r.get("as_sample_py") and r.get("cuda_graphs") and not r.get("fell_back")]
    return min(rows, key=lambda r: r["step_ms"], default=None)


def goals(report: dict) -> list[str]:
    """The goals table: measured value, ratio to the goal, ratio to the paper's code (like with
    like: bare training steps against bare steps, generation alone against generation alone)."""
    paper = report.get("paper", {})
    best = paper.get("train_best")
    at_n = next((r for r in paper.get("generation", []) if r["steps"] == 1024), None)
    lines = ["## Goals", "", "| goal | measured | measured / goal | ours / the paper's code |",
             "|---|---|---|---|"]
    for preset, goal in GOALS.items():
        row = _default_row(report, preset)
        if row is None or row.get("mfu") is None:
            lines.append(f"| {preset}: MFU >= {goal:.0%} | not measured | | |")
            continue
        versus = (f"{best['ratio']:.2f}x tokens/s (bare training steps, each side's fastest)"
                  if preset == "small" and best else "")
        lines.append(f"| {preset}: MFU >= {goal:.0%} | {row['mfu']:.1%} "
                     f"({row['tokens_per_s']:,.0f} tokens/s) | {row['mfu'] / goal:.2f} | "
                     f"{versus} |")
    step = _as_sample_py(report)
    decode = report.get("decode", {})
    versus = (f"{at_n['ratio_generate']:.2f}x faster generation (S = 1024, compilation apart)"
              if at_n else "")
    if step is not None:
        lines.append(f"| decode: <= {DECODE_GOAL_MS} ms per call (small, batch "
                     f"{decode['batch_size']}, n = {decode['seq_len']}) | {step['step_ms']:.3f} ms "
                     f"({step['name']}, {step['kernels']} kernels) | "
                     f"{DECODE_GOAL_MS / step['step_ms']:.2f} | {versus} |")
    else:
        lines.append(f"| decode: <= {DECODE_GOAL_MS} ms per call | not measured | | {versus} |")
    lines += ["", "measured / goal above 1 meets the goal (for the decode call: goal / measured)."]
    return lines + [""]


def markdown(report: dict) -> str:
    env = report["environment"]
    smoke = " (smoke run: tiny sizes, not a measurement)" if report["smoke"] else ""
    lines = [f"# GPU report{smoke}",
             "",
             f"{env['device']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
             f"Python {env['python']}, {env['date']}, commit {env['git']}. Made by "
             "`make gpu-report` (benchmarks/gpu_report.py: its docstring says what each item "
             "runs) in one call"
             + (f" of {report['seconds']:.0f} s." if "seconds" in report else " (under way)."), ""]
    for note in report.get("notes", []):  # how a report put together from several runs was made
        lines += [f"Note: {note}", ""]
    for what in ("left", "skipped"):
        for entry in report.get(what, []):
            lines += [f"{'Left for a second call' if what == 'left' else 'Skipped'}: {entry}", ""]
    lines += goals(report)
    if report.get("plan"):
        lines += call_lines(report)
    if "checks" in report:
        lines += checks_lines(report["checks"])
    if "train" in report:
        lines += train_lines(report["train"])
    for part, title, body in (
            ("decode", "One decoder step (`decode_step.py`)", decode_lines),
            ("paper", "The paper's code beside ours (`paper_baseline.py`)", paper_lines),
            ("generation", "Generation: KV-cache decoder vs the encoder baseline",
             generation_lines)):
        if part in report:
            error = report[part].get("error")
            lines += [f"## {title}", "", *([f"failed: {error}", ""] if error else []),
                      *body(report[part])]
    if "e2e" in report:
        lines += e2e_lines(report["e2e"])
    return "\n".join(lines)


def call_lines(report: dict) -> list[str]:
    """The plan as it ran: each item's estimate beside the seconds it took (what ESTIMATE_S is
    updated from)."""
    took = report.get("item_seconds", {})
    lines = ["## The call", "", "| item | estimate s | took s |", "|---|---|---|"]
    for item in report["plan"]:
        seconds = took.get(item["item"])
        lines.append(f"| {item['item']} | {item['estimate_s']:.0f} | "
                     f"{'' if seconds is None else f'{seconds:.0f}'} |")
    return lines + [""]


def checks_lines(c: dict) -> list[str]:
    failed = [t for t in c["tests"] if t["outcome"] in ("FAILED", "ERROR")]
    lines = ["## Correctness checks (`pytest -m gpu`, run first)", "",
             f"{c.get('summary', 'under way')}"
             + (f" ({c['seconds']:.0f} s)" if "seconds" in c else "") + ".", ""]
    if c.get("error"):
        lines += [f"failed: {c['error']}", ""]
    reasons = c.get("reasons", {})
    tests = c["tests"] + [{"test": test, "outcome": "ERROR"} for test in reasons
                          if "::" not in test]  # modules that could not be collected
    lines += ["| test | outcome | why |", "|---|---|---|"]
    lines += [f"| {t['test']} | {t['outcome']} | {reasons.get(t['test'], '').replace('|', '/')} |"
              for t in tests]
    return lines + ([""] if not failed else ["", f"{len(failed)} failed: see the rows above.", ""])


def train_lines(rows: list[dict]) -> list[str]:
    lines = [f"## Training throughput (one GPU, seq 1024, {16 * ACCUMULATION} sequences per "
             "step, the real trainer with EMA)", "",
             "| model | ZeRO | precision | compiled | scope | attention | micro | workers | "
             "tokens/s | MFU | goal | MFU / goal | peak memory GiB | step s | loader / step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
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
    return lines + ["", "MFU counts 6N + 12 L d T FLOPs per token (N without the embedding "
                    "lookups) against the device's dense bf16 peak. loader / step: the loader "
                    "alone against what a step consumes (>= 10x needed).", ""]


def decode_lines(d: dict) -> list[str]:
    if not d.get("results"):
        return []
    lines = [f"{d['preset']}, batch {d['batch_size']}, n = {d['seq_len']}, {d['known']} known, "
             f"{d['targets']} drawn, {d['dtype']}; kernels: {d.get('kernels_are', 'operations')} "
             "per step; warm-up: the first call (compilation, capture), never timed.", "",
             "| step | kernels | ms per step | warm-up s | logits vs eager | same tokens |",
             "|---|---|---|---|---|---|"]
    for r in d["results"]:
        name = r.get("name", "compiled" if r["compiled"] else "eager")
        name += f" (trainer/sample.py {r['as_sample_py']})" if r.get("as_sample_py") else ""
        name += " FELL BACK TO EAGER" if r.get("fell_back") else ""
        lines.append(f"| {name} | {r.get('kernels', r.get('operations'))} | {r['step_ms']:.3f} | "
                     f"{r['warm_up_s']:.1f} | {r.get('max_logit_difference', 0):.1e} | "
                     f"{r.get('same_tokens', '')} |")
    return lines + [""]


def paper_lines(p: dict) -> list[str]:
    lines = []
    for part in ("train", "generation"):
        if p.get(f"{part}_error"):
            lines += [f"{part}: failed: {p[f'{part}_error']}", ""]
    if p.get("train"):
        lines += ["Bare training steps on both sides (random tokens on the device, no loader, no "
                  "DeepSpeed: the paper's loop as its train_AOGPT_CL.py runs it, ours with our "
                  "network, loss and order sampler), each loop's first step (compilation) "
                  "apart.", "",
                  "| loop | paper tokens/s | ours tokens/s | ours / paper | first step s "
                  "(paper / ours) |", "|---|---|---|---|---|"]
        lines += [f"| {'compiled' if r['compiled'] else 'eager'} | {r['paper_tokens_per_s']:,.0f} "
                  f"| {r['ours_tokens_per_s']:,.0f} | {r['ratio']:.2f}x | "
                  f"{r.get('paper_first_step_s', 0):.1f} / {r.get('ours_first_step_s', 0):.1f} |"
                  for r in p["train"]]
        lines.append("")
    if p.get("generation"):
        lines += ["Each sampler in a fresh process, generating twice: the first samples come after "
                  "its start-up and compilation; generation is the second call alone.", "",
                  "| S | samples | paper: generation s / first samples s | ours | paper / ours "
                  "(generation / first samples) |", "|---|---|---|---|---|"]
        for r in p["generation"]:
            paper, ours = r["paper"], r["ours"]
            lines.append(f"| {r['steps']} | {r['samples']} | {paper['generate_s']:.2f} / "
                         f"{paper['first_samples_s']:.1f} | {ours['generate_s']:.2f} / "
                         f"{ours['first_samples_s']:.1f} | {r['ratio_generate']:.2f}x / "
                         f"{r['ratio_first_samples']:.2f}x |")
        lines.append("")
    return lines


def generation_lines(g: dict) -> list[str]:
    if not g.get("results"):
        return []
    floor = g.get("hbm_floor_ms")
    lines = [f"{g['preset']}, batch {g['batch_size']}, n = {g['seq_len']}, {g['dtype']}, CUDA "
             "graphs on both (on a GPU); warm-up (compilation, capture, one generation) apart"
             + (f"; memory floor of a decoder call {floor:.3f} ms" if floor else "") + ".", "",
             "| steps S | compiled | decoder s | encoder s | ratio | ms per decoder call | goal | "
             "ratio / goal | warm-up s (decoder / encoder) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in g["results"]:
        at_goal = r["steps"] == g["seq_len"]  # the goal is set for S = n
        goal = f"{GENERATION_GOAL:.0f}x" if at_goal else ""
        versus = f"{r['ratio'] / GENERATION_GOAL:.2f}" if at_goal else ""
        ms = r.get("decoder_ms_per_call")
        warm = (f"{r['decoder_warm_up_s']:.1f} / {r['encoder_warm_up_s']:.1f}"
                if "decoder_warm_up_s" in r else "")
        lines.append(f"| {r['steps']} | {r.get('compiled', False)} | {r['decoder_s']:.3f} | "
                     f"{r['encoder_s']:.3f} | {r['ratio']:.1f}x | "
                     f"{'' if ms is None else f'{ms:.3f}'} | {goal} | {versus} | {warm} |")
    return lines + [""]


def e2e_lines(e: dict) -> list[str]:
    if "steps" not in e:
        return ["## End to end: `trainer/main.py`, the small recipe", "",
                f"failed: {e['error']}", ""]
    return ["## End to end: `trainer/main.py`, the small recipe", "",
            f"{'OK' if e['ok'] else 'FAILED'}: {e['steps']} steps of {e['tokens_per_step']:,} "
            f"tokens in two launches ({e['first_launch_steps']} steps, then resumed to "
            f"{e['steps']}); loss {_num(e['first_loss'])} at step 1 -> {_num(e['last_loss'])} at "
            f"step {e['last_step']}; checkpoints {', '.join(e['checkpoints'])}; resumed: "
            f"{e['resumed']}; final weights: {e['final_weights']}; "
            f"{sum(e['seconds']):.0f} s in all."
            + (f" Error: {e['error']}" if "error" in e else ""), ""]


def failed_parts(report: dict) -> list[str]:
    return [part for part in PARTS if part in report and (
        (part == "train" and any("error" in r for r in report["train"]))
        or (part == "e2e" and not report["e2e"].get("ok"))
        or (part == "paper" and any(k.endswith("_error") for k in report["paper"]))
        or (part in ("checks", "decode", "generation") and "error" in report[part]))]


@cli_entry
def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    budget = float("inf") if args.smoke else args.budget  # the estimates are a GPU's
    previous = (args.out or DEFAULT_OUT).with_suffix(".json")
    existing = json.loads(previous.read_text()) if args.merge and previous.is_file() else {}
    items = plan(args, existing)
    kept, left = fit(items, budget)
    if args.dry_run:
        print("\n".join(plan_lines(items, kept, left, args.budget)))
        problem = paper_problem(args.paper) if any(i.part == "paper" for i in kept) else None
        if problem:
            print(f"note: {problem}: a run would refuse to start ({PAPER_HOW})")
    check_plan(args, kept, left)
    if args.dry_run:
        return 0
    data = {"smoke": args.smoke, "environment": environment(),
            "plan": [{"part": i.part, "item": i.name, "estimate_s": i.estimate_s} for i in kept],
            "left": [f"{i.name} (~{i.estimate_s:.0f} s)" for i in left], "skipped": []}
    data.update({part: existing[part] for part in PARTS if part in existing})
    print(f"GPU report on {data['environment']['device']}: {', '.join(args.parts)}, budget "
          f"{budget:.0f} s; writing {args.out}", flush=True)
    print("\n".join(plan_lines(items, kept, left, args.budget)), flush=True)
    with tempfile.TemporaryDirectory(prefix="aogpt_gpu_report_") as tmp:
        report = Report(args, Path(tmp), data)
        report.save()
        for item in kept:
            remaining = budget - (time.perf_counter() - started)
            if item.estimate_s > remaining and not args.smoke:
                data["skipped"].append(f"{item.name} (~{item.estimate_s:.0f} s; "
                                       f"{remaining:.0f} s of the budget left)")
                print(f"  skipped, over the budget: {item.name}", flush=True)
                report.save()
                continue
            item_start = time.perf_counter()
            item.run(report, remaining)
            data.setdefault("item_seconds", {})[item.name] = time.perf_counter() - item_start
            report.save()  # after each item: a cut call keeps what it measured
        data["seconds"] = time.perf_counter() - started
        report.save()
    print(f"report: {args.out} and {args.out.with_suffix('.json')} ({data['seconds']:.0f} s)")
    failed = failed_parts(data)
    if failed:
        print(f"failed: {', '.join(failed)} (see the report)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
