"""A real SLURM cluster on this machine for the tests, and jobs submitted to it.

The cluster is the one of slurm/dev/local_cluster.sh: two nodes (two slurmd on this host, each
with its own /dev/shm), started once and reused by later runs. The tests skip, saying why, only
where it cannot run: SLURM not installed (.ci/run installs it), not root, or a start that fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO / "slurm" / "dev" / "local_cluster.sh"
SHARED_TEXT = REPO.parent / "shared" / "data" / "wikitext-2" / "valid.txt"


@dataclass
class Job:
    id: str
    log: Path


class Cluster:
    def __init__(self, slurm_conf: str):
        self.env = {**os.environ, "SLURM_CONF": slurm_conf, "AOGPT_PYTHON": sys.executable,
                    "OMP_NUM_THREADS": "1"}
        try:  # the templates meet at the first node's hostname, which CI may not resolve
            socket.gethostbyname(socket.gethostname())
        except OSError:
            self.env["AOGPT_MASTER_ADDR"] = "127.0.0.1"

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(command, capture_output=True, text=True, env=self.env, cwd=REPO,
                              check=check, timeout=60)

    def sbatch(self, script: str, log: Path, *flags: str, **settings: str) -> Job:
        """Submits a template from the repository root, as a user would, with extra settings."""
        env = {**self.env, **settings}
        result = subprocess.run(["sbatch", "--parsable", f"--output={log}", *flags, script],
                                capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
        assert result.returncode == 0, f"sbatch {script} failed: {result.stderr.strip()}"
        return Job(id=result.stdout.strip().split(";")[0], log=log)

    def info(self, job: Job) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, ...)."""
        line = self.run("scontrol", "show", "job", "-o", job.id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", line))

    def wait_for(self, job: Job, condition, what: str, timeout: float) -> dict[str, str]:
        """Polls the job until condition(info) holds; on timeout cancels it and shows its log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.info(job)
            if condition(info):
                return info
            time.sleep(1)
        self.run("scancel", job.id, check=False)
        raise AssertionError(f"job {job.id}: no {what} within {timeout:.0f} s "
                             f"(state {info.get('JobState')}); log:\n{log_tail(job)}")

    def start_requeued(self, job: Job, timeout: float = 60) -> None:
        """Starts a requeued job now instead of after SLURM's hold of about two minutes.

        The hold is there so that the old run's steps are gone first: a start before that is
        refused ("Job credential revoked"). All nodes are on this host, so wait for the job's
        slurmstepd processes to end, then lift the hold.
        """
        deadline = time.monotonic() + timeout
        while job_steps_alive(job):
            assert time.monotonic() < deadline, f"job {job.id}: old steps still alive"
            time.sleep(0.5)
        self.run("scontrol", "update", f"JobId={job.id}", "StartTime=now")

    def wait_done(self, job: Job, timeout: float = 420) -> dict[str, str]:
        finished = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
        return self.wait_for(job, lambda info: info.get("JobState") in finished, "end", timeout)


def job_steps_alive(job: Job) -> bool:
    """Whether a slurmstepd of the job (titled "slurmstepd: [<job>.<step>]") still runs here."""
    title = f"slurmstepd: [{job.id}.".encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().startswith(title):
                return True
        except OSError:  # the process ended while we looked
            continue
    return False


def log_tail(job: Job, lines: int = 60) -> str:
    if not job.log.exists():
        return "(no log)"
    return "\n".join(job.log.read_text(errors="replace").splitlines()[-lines:])


def start_cluster() -> Cluster | str:
    """The running test cluster (starting it if needed), or why there can be none here."""
    if shutil.which("slurmctld") is None or shutil.which("sbatch") is None:
        return "SLURM is not installed: run `slurm/dev/local_cluster.sh install` (root, apt)"
    if os.geteuid() != 0:
        return "the local SLURM test cluster runs its daemons as root; these tests are not root"
    result = subprocess.run(["bash", str(CLUSTER_SCRIPT), "start"], capture_output=True,
                            text=True, timeout=120)
    if result.returncode != 0:
        return f"the local SLURM cluster did not start: {result.stderr.strip()[-800:]}"
    conf = subprocess.run(["bash", str(CLUSTER_SCRIPT), "env"], capture_output=True, text=True,
                          check=True).stdout.strip().split("=", 1)[1]
    return Cluster(conf)


def write_documents(path: Path, count: int = 60) -> Path:
    """A .jsonl corpus: WikiText-2 articles where ../shared/data has them, else generated prose."""
    if SHARED_TEXT.is_file():
        text = SHARED_TEXT.read_text(encoding="utf-8")
        # Articles start at a top-level heading line " = Title = ".
        documents = [d.strip() for d in re.split(r"\n(?= = [^=].* = \n)", text) if d.strip()]
    else:
        words = ("the model reads every token in a random order and predicts the next one "
                 "given those it has seen so far while a cluster trains it on many nodes").split()
        documents = [" ".join(words[(d * 7 + i * i) % len(words)] for i in range(1500))
                     for d in range(count)]
    with path.open("w") as f:
        for document in documents[:count]:
            f.write(json.dumps({"text": document}) + "\n")
    return path


def metrics_steps(out_dir: Path) -> list[int]:
    path = out_dir / "metrics.jsonl"
    if not path.exists():
        return []
    complete_lines = path.read_text().split("\n")[:-1]  # the last one may be half written
    return [json.loads(line)["step"] for line in complete_lines if line.strip()]
