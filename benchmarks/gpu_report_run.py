"""Running the GPU report's items (benchmarks/gpu_report.py): each item a command in a process of
its own from the repository's root, its rows read back from its JSON while it runs, and the
report saved after every change, so that a call cut short keeps what it measured."""

from __future__ import annotations

import argparse
import contextlib
import datetime
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from race_table import TINY_LANGUAGE, TINY_TRAINING
from results import EXCEPTION_LINE, why

from aogpt.files import write_json_atomic, write_text_atomic
from aogpt.run_folder import RunFolder
from aogpt.trainer.metrics import read_metrics

REPO = Path(__file__).resolve().parent.parent
ACCUMULATION = 8  # micro-steps per optimizer step in the throughput runs
CHECK_FILES = ("tests/model/test_gpu_checks.py", "tests/trainer/test_gpu_syncs.py")
POLL_S = 1.0  # how often a running item's rows are read back
SETTING = ("preset", "zero", "precision", "compile", "attn", "scope", "micro", "workers", "lever")
# A speed lever of trainer/speed.py (RunConfig.speed) by its row's name: its setting
LEVERS = {"coalesce_grad_reduction": "speed.coalesce_grad_reduction=true",
          "fused_optimizer_ema": "speed.fused_optimizer_ema=true",
          "compiled_autograd": "speed.engine_compile=compiled_autograd",
          "deepcompile": "speed.engine_compile=deepcompile",
          "cuda_graphs": "speed.cuda_graphs=true"}


def setting_of(row: dict, key: str):
    """A row's setting (rows measured before the levers have none: "")."""
    return row.get(key, "" if key == "lever" else None)


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
    errors = [line for line in lines if re.search(r"error|Error|timed out", line)
              and "Hint:" not in line]  # torch.compile's advice after its error
    named = why(output)
    return named if EXCEPTION_LINE.search(named) else (errors or lines or ["no output"])[-1][:300]


LOG_TAIL_LINES = 60


def log_tail(output: str) -> list[str]:
    """A failed run's last LOG_TAIL_LINES lines, kept in the report's JSON: a GPU's traceback
    is seen once, and its one-line reason rarely says enough to mend it on a CPU."""
    return [line.rstrip()[:400] for line in output.strip().splitlines()[-LOG_TAIL_LINES:]]


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
        data["error"], data["log_tail"] = failure(output), log_tail(output)
    return data


@dataclass
class Report:
    """The report being made: its JSON (data), written with its markdown (render(data)) to
    args.out after every change; scratch: a folder for the items' files."""

    args: argparse.Namespace
    scratch: Path
    render: Callable[[dict], str]
    data: dict = field(default_factory=dict)

    def save(self) -> None:
        write_json_atomic(self.data, self.args.out.with_suffix(".json"))
        write_text_atomic(self.args.out, self.render(self.data))


def merged_rows(kept: list[dict], new: list[dict]) -> list[dict]:
    """The kept rows, each replaced by a new measurement of the same setting; new ones appended."""
    key = lambda row: tuple(setting_of(row, k) for k in SETTING)  # noqa: E731
    fresh = {key(row): row for row in new}
    rows = [fresh.pop(key(row), row) for row in kept]
    return rows + list(fresh.values())


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
    """A pretraining folder (train + val) of Python's documentation (three times over, to fill
    the training rows' batches), tokenized by owt_to_mds.py."""
    seq_len = 128 if report.args.smoke else 1024
    source = python_docs_corpus(report.scratch, copies=3)
    out = report.scratch / f"data_{seq_len}"
    code, output, seconds = run([sys.executable, "data_prep/owt_to_mds.py", "--out", str(out),
                                 "--source", str(source), "--seq-len", str(seq_len),
                                 "--val-fraction", "0.05",
                                 "--workers", str(min(8, os.cpu_count() or 1))], timeout)
    report.data["data"] = ({"path": str(out), "seconds": seconds} if code == 0 else
                           {"error": f"data_prep/owt_to_mds.py failed: {failure(output)}",
                            "seconds": seconds})


def python_docs_corpus(folder: Path, copies: int = 1) -> Path:
    """folder/python_docs.jsonl, written by the corpora command (python -m
    aogpt.data_prep.corpora python-docs), its documents repeated `copies` times."""
    subprocess.run([sys.executable, "-m", "aogpt.data_prep.corpora", "python-docs", "--out",
                    str(folder)], check=True, capture_output=True)
    source = folder / "python_docs.jsonl"
    source.write_text(source.read_text() * copies)
    return source


def train_row(setting: dict, name: str) -> Callable[[Report, float], None]:
    """Measures one training configuration (`name` in the log)."""
    def measure(report: Report, timeout: float) -> None:
        data = report.data.get("data", {})
        row = dict(setting)
        if "path" not in data:
            row["error"] = f"no training data ({data.get('error', 'not made')})"
        else:
            row.update(train_throughput(setting, Path(data["path"]), report, timeout))
        report.data["train"] = merged_rows(report.data.get("train", []), [row])
        print(f"  {name}: " + (
            f"{row['tokens_per_s']:,.0f} tokens/s, MFU {percent(row.get('mfu'))}"
            if "error" not in row else f"FAILED: {row['error']}"), flush=True)

    return measure


def train_throughput(setting: dict, data: Path, report: Report, timeout: float) -> dict:
    """One training row: benchmarks/train_throughput.py with the setting; a row marked
    `profile` also has its kernels' GPU time per class (the anatomy's, measured)."""
    args = report.args
    result = report.scratch / f"train_{len(list(report.scratch.glob('train_*.json')))}.json"
    seq = 128 if args.smoke else 1024
    profile = ["--profile", str(result.with_suffix(".txt"))] if setting.get("profile") else []
    lever = [LEVERS[setting["lever"]]] if setting.get("lever") else []
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
               f"model.attn_impl={setting['attn']}", f"data.num_workers={setting['workers']}",
               *lever, *profile]
    code, output, seconds = run(command, timeout)
    if code == 0 and result.is_file():
        return {**json.loads(result.read_text()), "seconds": seconds}
    return {"error": failure(output), "log_tail": log_tail(output), "seconds": seconds}


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
        result = report.scratch / f"paper_{part}.json"
        keep = _keep_paper(report, part)
        data = benchmark(paper_command(report.args, part, result), result, timeout, keep)
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


def paper_command(args: argparse.Namespace, part: str, result: Path) -> list[str]:
    command = [sys.executable, "benchmarks/paper_baseline.py", "--paper", str(args.paper),
               "--part", part, "--json", str(result)]
    if args.smoke:
        return command + ["--smoke", "--accumulation", "1", "--train-steps", "1"]
    # each side's fastest configuration on a GPU only, to save the time of the others
    return command + (["--train-modes", "compiled"] if part == "train" else [
        "--steps", "1024", "--released-only"])


def _keep_paper(report: Report, part: str) -> Callable[[dict], None]:
    """Keeps paper_baseline's rows of `part` in the report as they come."""
    paper = report.data.setdefault("paper", {})

    def keep(rows: dict) -> None:
        paper.update({key: rows[key] for key in (part, "train_best") if key in rows})
        paper[f"{part}_seconds"] = rows.get("seconds")
        paper.pop(f"{part}_error", None)
        if "error" in rows:
            paper[f"{part}_error"] = rows["error"]
        report.save()

    return keep


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


# the race's two networks, trained as a user trains them (a smoke run shrinks them)
RACE_CONFIGS = (("aogpt", "configs/synthetic.yaml"), ("gpt", "configs/gpt_synthetic.yaml"))
# on a GPU: batch 1 (latency) and 32 (throughput), each sampler compiled and replayed as CUDA
# graphs (the sampler's default there): chains, trees and branches, each without and with
# pre-drafts (docs/sampling-race.md: K = 4 and 6 with them reach 2x the GPT on a 2-core CPU)
RACE_ON_GPU = ["--batch-sizes", "1,32", "--drafts", "4,8", "--trees", "1,3", "--tree-depths",
               "0,3", "--predrafts", "0,8", "--compile", "on"]
RACE_SMOKE = ["--num-samples", "6", "--batch-sizes", "1,3", "--drafts", "2", "--trees", "1,2",
              "--predrafts", "0,2", "--timed-batches", "1", "--repeats", "1", "--compile", "off"]


def race(report: Report, timeout: float) -> None:
    """The sampling race on this device (benchmarks/sampling_race.py): an AO-GPT and a GPT of
    the first synthetic language, trained here by trainer/main.py (both at once), race left to
    right: the GPT one token per call against the AO-GPT's exact speculative samples."""
    start, smoke = time.perf_counter(), report.args.smoke
    left = lambda: timeout - (time.perf_counter() - start)  # noqa: E731
    folder = report.scratch / "race"
    language = folder / "language"
    code, output, _ = run([sys.executable, "data_prep/synthetic_to_mds.py", "--out",
                           str(language), *(TINY_LANGUAGE if smoke else [])], left())
    if code:
        _keep(report, "race", {"error": f"synthetic_to_mds.py failed: {failure(output)}"})
        return
    ds_config = "ds_configs/cpu.json" if smoke else "ds_configs/zero1.json"

    def train(name_config: tuple[str, str]) -> tuple[int, str, float]:
        name, config = name_config
        return run([sys.executable, "trainer/main.py", "--ds_config", ds_config, "--config",
                    config, f"data.path={language}", f"out_dir={folder / name}",
                    *(TINY_TRAINING if smoke else [])], left(), env={"OMP_NUM_THREADS": "1"})

    with ThreadPoolExecutor(len(RACE_CONFIGS)) as pool:
        trained = list(pool.map(train, RACE_CONFIGS))
    for (name, _), (code, output, _) in zip(RACE_CONFIGS, trained, strict=True):
        if code:
            _keep(report, "race", {"error": f"training the {name} network failed: "
                                            f"{failure(output)}", "log_tail": log_tail(output)})
            return
    result = report.scratch / "race.json"
    command = [sys.executable, "benchmarks/sampling_race.py", "--ao", str(folder / "aogpt"),
               "--gpt", str(folder / "gpt"), "--judge", str(language), "--json", str(result),
               *(RACE_SMOKE if smoke else RACE_ON_GPU)]
    data = benchmark(command, result, left(), lambda rows: _keep(report, "race", rows))
    _keep(report, "race", {**data, "seconds": time.perf_counter() - start})
    for row in data.get("rows", []):
        rates = ", ".join(f"{size}: {x:.2f}x" for size, x in row.get("speedup", {}).items())
        print(f"  race: {row['label']}: {row['calls_per_token']:.3f} calls per token; "
              f"tokens/s against the GPT's by batch size {rates or 'not timed'}", flush=True)


def end_to_end(report: Report, timeout: float) -> None:
    """30 steps of trainer/main.py in two launches (20, then resumed to 30)."""
    data = report.data.get("data", {})
    if "path" not in data:
        report.data["e2e"] = {"ok": False, "error": f"no training data ({data.get('error')})"}
        return
    out = report.scratch / "e2e_run"
    command, steps, first, tokens = e2e_command(report.args, out, data["path"])
    start = time.perf_counter()
    code1, output1, seconds1 = run([*command, f"train.max_steps={first}"], timeout)
    code2, output2, seconds2 = run([*command, f"train.max_steps={steps}"],
                                   timeout - (time.perf_counter() - start))
    result = {"steps": steps, "first_launch_steps": first, "tokens_per_step": tokens,
              "exit_codes": [code1, code2], "seconds": [seconds1, seconds2],
              **e2e_outcome(RunFolder(out), first, output2)}
    result["ok"] = (code1 == code2 == 0 and result["resumed"] and result["final_weights"]
                    and result["last_step"] == steps and result["last_loss"] < result["first_loss"])
    if not result["ok"]:
        result["error"] = failure(output2 if code1 == 0 else output1)
    report.data["e2e"] = result
    print(f"  e2e: {'ok' if result['ok'] else 'FAILED'}: loss {result['first_loss']} -> "
          f"{result['last_loss']}, resumed={result['resumed']}", flush=True)


def e2e_command(args: argparse.Namespace, out: Path, data: str
                ) -> tuple[list[str], int, int, int]:
    """trainer/main.py's command for the small recipe (tiny for --smoke), its steps in all and
    in the first launch, and its tokens per step."""
    micro, seq = (4, 128) if args.smoke else (16, 1024)
    steps, first = (6, 4) if args.smoke else (30, 20)
    return [sys.executable, "trainer/main.py",
            "--ds_config", "ds_configs/cpu.json" if args.smoke else "ds_configs/zero2.json",
            "--config", "configs/tiny.yaml" if args.smoke else "configs/ao_gpt_small.yaml",
            f"out_dir={out}", f"data.path={data}", f"model.block_size={seq}",
            f"train.micro_batch_size={micro}", f"train.tokens_per_step={micro * seq * 4}",
            "optim.warmup_steps=5", "train.log_every=1", f"checkpoint.every={first}",
            f"eval.every={first}", "eval.batches=1", "eval.num_orders=1", "eval.sets=[]",
            "logging.wandb='off'"], steps, first, micro * seq * 4


def e2e_outcome(trained: RunFolder, first: int, second_output: str) -> dict:
    """What the two launches left: the losses, the checkpoints, the resume, the weights."""
    records = read_metrics(trained.metrics_file) if trained.metrics_file.is_file() else []
    losses = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    return {"first_loss": losses[0][1] if losses else None,
            "last_loss": losses[-1][1] if losses else None,
            "last_step": losses[-1][0] if losses else None, "checkpoints": trained.tags(),
            "resumed": f"at step {first}" in second_output and "resumed from" in second_output,
            "final_weights": trained.final_weights.is_file()}


def _keep(report: Report, part: str, data: dict) -> None:
    report.data[part] = data
    report.save()


def environment() -> dict:
    """The machine and code the report measures."""
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
    """HEAD's short hash, with "-dirty" where the measured files differ from it (a device call
    sends the working tree beside the git folder of the session's start)."""
    done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO,
                          capture_output=True, text=True)
    return done.stdout.strip() or None


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


# An item may take this many times its estimate before its process is ended: a compilation that
# hangs (a lever's first graph, say) costs one row, not the rest of the call.
ITEM_ALLOWANCE = 3
# What a call spends before its first item (the interpreter's start, the plan): an item whose
# estimate fills the budget exactly still starts (it is ended at the budget, as any item is).
START_S = 15


def run_items(report: Report, items: list, budget: float, started: float) -> None:
    """Runs the planned items in order, each within what is left of the budget and within
    ITEM_ALLOWANCE times its estimate (an item whose estimate no longer fits is skipped and
    named), saving the report after each."""
    data = report.data
    report.save()
    for item in items:
        remaining = budget - (time.perf_counter() - started)
        if item.estimate_s > remaining + START_S:
            data["skipped"].append(f"{item.name} (~{item.estimate_s:.0f} s; "
                                   f"{remaining:.0f} s of the budget left)")
            print(f"  skipped, over the budget: {item.name}", flush=True)
            report.save()
            continue
        item_start = time.perf_counter()
        item.run(report, min(remaining, ITEM_ALLOWANCE * item.estimate_s))
        data.setdefault("item_seconds", {})[item.name] = time.perf_counter() - item_start
        report.save()  # after each item: a cut call keeps what it measured
    data["seconds"] = time.perf_counter() - started
    report.save()
