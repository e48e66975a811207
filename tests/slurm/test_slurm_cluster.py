"""The sbatch templates on a real SLURM cluster (two slurmd on this host): data prep, training on
two nodes, and a preemption warning that checkpoints, requeues and resumes.

Everything runs as a user would: `sbatch slurm/<template>.sh` from the repository root with
settings in the environment and sbatch flags, CPU-only (`--gpus-per-node=0`), gloo.
"""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_testing import (
    REPO,
    Cluster,
    Job,
    log_tail,
    metrics_steps,
    start_cluster,
    write_documents,
)

from aogpt.data_prep.manifest import read_manifest
from aogpt.model import load_checkpoint

sys.path.insert(0, str(REPO / "tests" / "trainer"))  # the trainer tests' synthetic language
from trainer_testing import SEQ_LEN, SYNTHETIC_MODEL  # noqa: E402

pytestmark = pytest.mark.slow

TINY = {"AOGPT_CONFIG": "configs/tiny.yaml"}


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    found = start_cluster()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="module")
def data_dir(cluster: Cluster, tmp_path_factory) -> Path:
    """Training data made by slurm/data_prep.sh (owt_to_mds.py on real text) inside a job."""
    work = tmp_path_factory.mktemp("slurm_data")
    corpus = write_documents(work / "docs.jsonl")
    job = cluster.sbatch("slurm/data_prep.sh", work / "data_prep.out", "--cpus-per-task=2",
                         "--mem=1G", AOGPT_DATA=str(work / "data"), AOGPT_DATA_SOURCE=str(corpus),
                         AOGPT_SEQ_LEN="128", AOGPT_DATA_ARGS="--val-fraction 0.1")
    info = cluster.wait_done(job, timeout=120)
    assert info["JobState"] == "COMPLETED", log_tail(job)
    return work / "data"


def test_data_prep_job_builds_the_training_data(data_dir: Path):
    manifest = read_manifest(data_dir)
    assert manifest["seq_len"] == 128
    assert manifest["splits"]["train"]["samples"] > 100
    assert manifest["splits"]["val"]["samples"] > 0


def test_a_two_task_array_prepares_the_dataset_one_task_does(cluster: Cluster, tmp_path: Path):
    """`sbatch --array=0-1 slurm/data_prep.sh`: two tasks (one per node when both are free)
    tokenize a slice each of a corpus of four files, the first submits the merge, and the merged
    folder is byte for byte what owt_to_mds.py writes from the same files in one task."""
    lines = write_documents(tmp_path / "all.jsonl").read_text().splitlines(keepends=True)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for part in range(4):
        (corpus / f"part{part}.jsonl").write_text("".join(lines[part * 15:(part + 1) * 15]))
    flags = {"AOGPT_SEQ_LEN": "128", "AOGPT_DATA_ARGS": "--val-fraction 0.1",
             "AOGPT_DATA_SOURCE": str(corpus)}
    array = cluster.sbatch("slurm/data_prep.sh", tmp_path / "array-%a.out", "--array=0-1",
                           "--cpus-per-task=2", "--mem=1G", AOGPT_DATA=str(tmp_path / "data"),
                           **flags)
    first = Job(array.id, tmp_path / "array-0.out")
    deadline = time.monotonic() + 120
    while "merge: job" not in (first.log.read_text() if first.log.exists() else ""):
        assert time.monotonic() < deadline, f"no merge job submitted:\n{log_tail(first)}"
        time.sleep(0.5)
    merge_id = re.search(r"merge: job (\d+)", first.log.read_text()).group(1)
    merge = Job(merge_id, tmp_path / f"aogpt-data-merge-{merge_id}.out")
    info = cluster.wait_done(merge, timeout=300)
    assert info["JobState"] == "COMPLETED", log_tail(merge) + log_tail(first)
    assert "--merge-slices 2" in merge.log.read_text()
    for task in range(2):
        assert f"--slice {task}/2" in (tmp_path / f"array-{task}.out").read_text()
    one_task = tmp_path / "one"
    result = subprocess.run([sys.executable, "data_prep/owt_to_mds.py", "--out", str(one_task),
                             "--source", str(corpus), "--seq-len", "128", "--val-fraction",
                             "0.1", "--workers", "1"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    merged = {str(path.relative_to(tmp_path / "data")): path.read_bytes()
              for path in sorted((tmp_path / "data").rglob("*")) if path.is_file()}
    expected = {str(path.relative_to(one_task)): path.read_bytes()
                for path in sorted(one_task.rglob("*")) if path.is_file()}
    assert sorted(merged) == sorted(expected)  # no .slices left
    for name, data in expected.items():
        if name != "manifest.json":  # which holds the time it was written
            assert merged[name] == data, name


@pytest.fixture(scope="module")
def two_node_run(cluster: Cluster, data_dir: Path, tmp_path_factory) -> tuple[Job, dict, Path]:
    """slurm/train_small.sh as is: two nodes, one CPU process each; (job, its state, out_dir)."""
    work = tmp_path_factory.mktemp("slurm_train")
    job = cluster.sbatch(
        "slurm/train_small.sh", work / "train.out", "--gpus-per-node=0", **TINY,
        AOGPT_DATA=str(data_dir), AOGPT_OUT_DIR=str(work / "run"),
        AOGPT_OVERRIDES="train.max_steps=6 train.log_every=1 checkpoint.every=3 eval.every=6",
    )
    return job, cluster.wait_done(job), work / "run"


def test_train_small_runs_on_two_nodes_and_writes_metrics_and_checkpoints(two_node_run):
    job, info, out = two_node_run
    log = job.log.read_text()
    assert info["JobState"] == "COMPLETED", log_tail(job)
    assert "nodes (2): aogpt-node1 aogpt-node2" in log
    assert "world size 2 (1 per node)" in log  # what the trainer itself saw
    assert metrics_steps(out) == [1, 2, 3, 4, 5, 6]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_00000006"
    assert (out / "checkpoints" / "step_00000003" / "model.safetensors").is_file()
    model = load_checkpoint(out, weights="ema")
    assert model.num_params() > 0


def test_time_limit_warning_checkpoints_requeues_and_resumes(
        cluster: Cluster, synthetic_data: Path, tmp_path: Path):
    # One node, two processes; no periodic checkpoint, so the only one mid-run is the signal's.
    # It trains on the synthetic language (conftest.synthetic_data): what is asserted is how the
    # job stops and comes back, and GPT-2's head was most of each step's arithmetic. Its steps
    # take ~0.13 s alone on 2 cores, ~0.3 s in the full suite: the signal, sent after step 3,
    # must land well before the last step also on a faster machine (it takes ~1 s through SLURM).
    out, max_steps = tmp_path / "run", 60
    job = cluster.sbatch(
        "slurm/train_small.sh", tmp_path / "train.out", "--nodes=1", "--gpus-per-node=0", **TINY,
        AOGPT_PROCS_PER_NODE="2", AOGPT_DATA=str(synthetic_data), AOGPT_OUT_DIR=str(out),
        AOGPT_OVERRIDES=f"model.block_size={SEQ_LEN} {SYNTHETIC_MODEL} "
                        f"train.max_steps={max_steps} train.log_every=1 checkpoint.every=1000 "
                        "eval.every=0",
    )
    deadline = time.monotonic() + 300  # a cold DeepSpeed op build
    while len(metrics_steps(out)) < 3:
        assert time.monotonic() < deadline, f"no training progress:\n{log_tail(job)}"
        assert cluster.info(job)["JobState"] in {"PENDING", "RUNNING"}, log_tail(job)
        time.sleep(0.5)
    # What `#SBATCH --signal=B:USR1@300` does before the time limit: USR1 to the batch shell.
    cluster.run("scancel", "--signal=USR1", "--batch", job.id)
    requeued = {"Restarts": "1", "JobState": "PENDING"}
    cluster.wait_for(job, lambda info: requeued.items() <= info.items(), "requeue", timeout=120)
    cluster.start_requeued(job)
    info = cluster.wait_done(job)
    log = job.log.read_text()  # --open-mode=append: both runs are in it
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log_tail(job)

    assert f"requeueing job {job.id}" in log
    stopped = int(re.search(r"stopping at step (\d+) on SIGTERM", log).group(1))
    resumed = int(re.search(r"resumed from \S+ at step (\d+)", log).group(1))
    assert 3 <= stopped < max_steps and resumed == stopped
    assert "restart 1" in log
    # Every step exactly once: the second run continued after the checkpoint, not from 0.
    assert metrics_steps(out) == list(range(1, max_steps + 1))
    tags = sorted(p.name for p in (out / "checkpoints").glob("step_*"))
    assert tags == [f"step_{stopped:08d}", f"step_{max_steps:08d}"]
    assert (out / "final" / "model.safetensors").is_file()


def test_eval_job_scores_the_trained_model(cluster: Cluster, two_node_run, data_dir: Path,
                                           tmp_path: Path):
    _, _, out = two_node_run
    results = tmp_path / "eval.json"
    job = cluster.sbatch("slurm/eval.sh", tmp_path / "eval.out", "--gpus-per-node=0",
                         "--cpus-per-task=2", AOGPT_CKPT=str(out), AOGPT_EVAL_DATA=str(data_dir),
                         AOGPT_EVAL_JSON=str(results),
                         AOGPT_EVAL_ARGS="--orders l2r,random --num-orders 2 --max-samples 16")
    info = cluster.wait_done(job)
    assert info["JobState"] == "COMPLETED", log_tail(job)
    report = json.loads(results.read_text())
    assert report["checkpoint"] == str(out) and report["weights"] == "ema"
    assert len(report["results"]) == 1
