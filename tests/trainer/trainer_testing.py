"""Helpers for the trainer tests: real-text MDS data made by owt_to_mds.py, the synthetic
language's made by synthetic_to_mds.py, 2-process launches (each on a fresh free port)."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import pydoc_data.topics
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from aogpt.trainer.dist_env import free_port, init_process_group
from aogpt.trainer.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
MAIN = str(REPO / "trainer" / "main.py")
OWT_TO_MDS = str(REPO / "data_prep" / "owt_to_mds.py")
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext-2" / "valid.txt"
BIN = Path(sys.executable).parent
SEQ_LEN = 64

# A tiny AO-GPT on sequences of 64: 32 sequences (2,048 tokens) per step, 8 per micro-batch, so
# 2 accumulation steps on 2 processes. Fast enough for 2 CPU cores, big enough to learn.
TINY_RUN = [
    f"model.block_size={SEQ_LEN}", "train.tokens_per_step=2048", "train.micro_batch_size=8",
    "data.num_workers=1", "optim.lr=2e-3", "optim.warmup_steps=5", "optim.decay_steps=200",
    "train.log_every=1", "eval.every=6", "eval.batches=2", "eval.num_orders=2",
    "checkpoint.every=4", "checkpoint.keep_last=2", "ema.decay=0.99",
]


# The tiny run on the synthetic language (conftest.synthetic_data): its vocabulary, not GPT-2's
SYNTHETIC_VOCAB = 128
SYNTHETIC_MODEL = f"model.vocab_size={SYNTHETIC_VOCAB}"
SYNTHETIC_RUN = [*TINY_RUN, SYNTHETIC_MODEL]

# The reference run's length: its first 12 steps are also every shorter run's of the same
# settings (the schedule depends on optim.decay_steps, not on train.max_steps)
REFERENCE_STEPS = 18


# one process, one micro-batch of 8 x 64 tokens per step, a validation and a checkpoint every 3;
# the synthetic language's model (conftest.synthetic_data is the data)
LOGGED_RUN = [*SYNTHETIC_RUN, "train.tokens_per_step=512", "eval.every=3", "train.log_every=2",
              "checkpoint.every=3"]


def real_documents() -> list[str]:
    """WikiText-2 validation articles from ../shared/data, else Python's own documentation."""
    if WIKITEXT.is_file():
        articles = WIKITEXT.read_text(encoding="utf-8").split("\n = ")
        return [a.strip() for a in articles if len(a.strip()) > 200]
    # The interpreter ships its reference manual's topics as English prose: real text, offline.
    docs = [inspect.getdoc(module) for module in (json, os, socket, subprocess, signal)]
    return [text for text in pydoc_data.topics.topics.values() if len(text) > 200] + [
        doc for doc in docs if doc]  # a module without a docstring has None


def build_data(out: Path | str, documents: list[str], val_fraction: float = 0.05,
               source_dir: Path | None = None, extra: list[str] = (),
               env: dict | None = None) -> Path | str:
    """A data folder (or s3:// URL) made by the real data_prep/owt_to_mds.py from these documents
    (written as a .jsonl next to `out`, or in `source_dir`)."""
    source = (source_dir or Path(out).parent) / f"{Path(str(out)).name}.jsonl"
    source.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    result = subprocess.run(
        [sys.executable, OWT_TO_MDS, "--out", str(out), "--source", str(source),
         "--seq-len", str(SEQ_LEN), "--val-fraction", str(val_fraction), "--workers", "1",
         *extra], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    return out


def build_synthetic(out: Path) -> Path:
    """A data folder of the synthetic language made by the real data_prep/synthetic_to_mds.py:
    as many training sequences of SEQ_LEN as real_documents() make (WikiText-2's), 200 held out."""
    result = subprocess.run(
        [sys.executable, str(REPO / "data_prep" / "synthetic_to_mds.py"), "--out", str(out),
         "--seq-len", str(SEQ_LEN), "--vocab", str(SYNTHETIC_VOCAB), "--train-samples", "3780",
         "--val-samples", "200"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return out


def logged_command(data, out, *overrides: str) -> list[str]:
    """trainer/main.py in one process (LOGGED_RUN: data is the synthetic language), as a user
    types it."""
    return [sys.executable, MAIN, "--ds_config", "ds_configs/cpu.json", "--config",
            "configs/tiny.yaml", f"data.path={data}", f"out_dir={out}", *LOGGED_RUN, *overrides]


def train_logged(data, out: Path, *overrides: str) -> str:
    """Trains (logged_command) with the output going to out_dir's sibling `<name>.log`, as under
    nohup or SLURM; returns that log's text."""
    log = out.parent / f"{out.name}.log"
    with log.open("w") as sink:
        done = subprocess.run(logged_command(data, out, *overrides), cwd=REPO, stdout=sink,
                              stderr=subprocess.STDOUT, timeout=300)
    output = log.read_text()
    assert done.returncode == 0, output[-3000:]
    return output


def reference_args(data, out_dir, ds_config="ds_configs/cpu.json", *overrides: str) -> list[str]:
    """trainer/main.py's arguments for the reference's settings (SYNTHETIC_RUN: data is the
    synthetic language; ZeRO-1 fp32 by default, REFERENCE_STEPS steps)."""
    return ["--ds_config", str(ds_config), "--config", "configs/tiny.yaml", f"data.path={data}",
            f"out_dir={out_dir}", *SYNTHETIC_RUN, f"train.max_steps={REFERENCE_STEPS}",
            *overrides]


def train_reference(data, out_dir: Path) -> str:
    """The user command of the reference run: the deepspeed launcher, 2 processes, ZeRO-1 fp32,
    REFERENCE_STEPS steps. Returns JSON: its output and the launch's port."""
    launcher = Launcher()
    result = launcher.run("deepspeed", reference_args(data, out_dir))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    return json.dumps({"output": output, "port": launcher.ports[-1]})


def take(args: list[str], flag: str) -> str | None:
    """The value of `flag` in args, removed from them (None where it is absent): the
    tests/trainer/run_*.py wrappers take their own flags before trainer/main.py reads the rest."""
    if flag not in args:
        return None
    at = args.index(flag)
    value = args[at + 1]
    del args[at:at + 2]
    return value


def as_one_process(monkeypatch) -> None:
    """The environment of rank 0 of a 1-process run, for tests that open the loader themselves."""
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}.items():
        monkeypatch.setenv(name, value)


class Launcher:
    """Starts trainer/main.py on 2 processes the way users do; remembers ports for cleanup.

    Its runs get one thread per process (`environment`): runs that a test compares must be
    bitwise repeatable. With torch's default of every core per process (2 processes x 2 threads
    on 2 cores), 2 of 33 identical 2-process runs drew one micro-batch's first half (the rows
    of the first of 2 threads) ~3 float32 ulps per token away from the other runs (same data,
    weights and orders; step 1's loss 10.825516 against 10.825512), and
    Adam turns such a difference in a near-zero gradient into a full step on that weight."""

    def __init__(self):
        self.ports: list[int] = []

    @staticmethod
    def environment(**extra: str) -> dict[str, str]:
        return {**os.environ, "OMP_NUM_THREADS": "1", **extra}

    def command(self, launcher: str, args: list[str], script: str | Path = MAIN) -> list[str]:
        """`launcher` (deepspeed, aogpt.launch: deepspeed's wrapped, or torchrun) starting
        `script` (trainer/main.py, or a test's wrapper of it) on 2 processes with these
        arguments, on a fresh port."""
        port = free_port()
        self.ports.append(port)
        if launcher in ("deepspeed", "aogpt.launch"):
            start = ([str(BIN / "deepspeed")] if launcher == "deepspeed"
                     else [sys.executable, "-m", "aogpt.launch"])
            return [*start, "--num_gpus", "2", "--master_port", str(port), str(script), *args]
        return [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port),
                str(script), *args]

    def run(self, launcher: str, args: list[str],
            timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(launcher, args), capture_output=True, text=True,
                              cwd=REPO, env=self.environment(), timeout=timeout)

    def run_and_signal(self, launcher: str, args: list[str], out_dir: Path, after_step: int,
                       sig: int = signal.SIGTERM, timeout: float = 300) -> tuple[int, str]:
        """Runs, and once `after_step` is logged sends `sig` to the launcher's whole process group
        (as scancel or Ctrl-C would); returns the launcher's exit status and its output."""
        log = out_dir.parent / f"{out_dir.name}.log"
        with log.open("w") as sink:
            proc = subprocess.Popen(self.command(launcher, args), stdout=sink,
                                    stderr=subprocess.STDOUT, cwd=REPO, env=self.environment(),
                                    start_new_session=True)
            deadline = time.monotonic() + timeout
            metrics = out_dir / "metrics.jsonl"
            while not (metrics.is_file()
                       and any(r["step"] >= after_step for r in read_metrics(metrics))):
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the run never reached the step to signal at"
                time.sleep(0.2)
            group = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            os.killpg(proc.pid, sig)
            returncode = proc.wait(timeout=timeout)
            _, alive = psutil.wait_procs(group, timeout=timeout)  # the launcher's children too
            assert not alive, f"still running after the signal: {alive}"
        return returncode, log.read_text()


def losses(out_dir: Path, key: str = "loss") -> dict[int, float | None]:
    return {r["step"]: r.get(key) for r in read_metrics(out_dir / "metrics.jsonl") if key in r}



STEP_SAMPLES = """
import json, sys
import torch
from aogpt.trainer.config import load_config
from aogpt.trainer.data import TrainBatches, check_data
from aogpt.trainer.dist_env import setup_distributed_env
steps, overrides = int(sys.argv[1]), sys.argv[2:]
cfg = load_config("configs/tiny.yaml", overrides)
env = setup_distributed_env()
batches = TrainBatches(cfg, check_data(cfg, env), env, torch.device("cpu"))
accum = cfg.gradient_accumulation_steps(1)
print(json.dumps([sorted(i for _ in range(accum) for i in next(batches)[1].tolist())
                  for _ in range(steps)]))
batches.close()
"""


def step_samples(overrides: list[str], steps: int) -> dict[int, list[int]]:
    """The dataset indices of the samples of training steps 1..steps (sorted), as the real loader
    deals them to a run with these overrides. Streaming deals every optimizer step the same samples
    on any number of processes (the elastic-resume guarantee), so one process tells them."""
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    result = subprocess.run([sys.executable, "-c", STEP_SAMPLES, str(steps), *overrides],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return dict(enumerate(json.loads(result.stdout.splitlines()[-1]), start=1))


@contextlib.contextmanager
def one_process_group():
    """The trainer's process group (init_process_group) for a world of one in this process, with
    the launcher's variables it reads set inside and restored after: for tests that build
    DeepSpeed engines in the test process."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    init_process_group(timeout_s=60)  # the trainer's, as the engines expect
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
