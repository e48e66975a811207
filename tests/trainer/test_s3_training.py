"""Training and evaluation from a bucket of a real S3 server (tests/s3_testing.py), through
streaming's own S3 client: the same batches as the local folder, a node-local cache, a shard
damaged in the bucket named on one line, the server going away mid-run, bad locations refused
before any work; and (slow) 2-process DeepSpeed training from the bucket, killed with -9 and
resumed on another world size, step for step the run of the local folder."""

import gc
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from s3_testing import S3Server, SilentServer
from trainer_testing import (
    MAIN,
    REPO,
    SEQ_LEN,
    as_one_process,
    build_data,
    losses,
    real_documents,
    reference_args,
)

from aogpt import RunFailure, UsageError
from aogpt.data_prep.remote import TIMEOUT_SETTING
from aogpt.trainer import evaluate
from aogpt.trainer.config import load_config
from aogpt.trainer.data import TrainBatches, check_data, validation_loader
from aogpt.trainer.dist_env import setup_distributed_env

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    as_one_process(monkeypatch)
    yield
    gc.collect()  # streaming frees its shared memory when the dataset object goes


def config(data, tmp_path, *overrides):
    return load_config(REPO / "configs" / "tiny.yaml",
                       [f"data.path={data}", f"model.block_size={SEQ_LEN}",
                        "train.micro_batch_size=8", "train.tokens_per_step=512",
                        "data.num_workers=1", "eval.every=0", f"out_dir={tmp_path / 'run'}",
                        *overrides])


def batches_for(cfg):
    env = setup_distributed_env()
    return TrainBatches(cfg, check_data(cfg, env), env, CPU)


def draw(stream, count: int) -> list:
    return [next(stream) for _ in range(count)]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_the_bucket_streams_the_local_folders_batches_through_a_node_cache(s3_text_data,
                                                                          text_data, tmp_path):
    local = draw(batches_for(config(text_data, tmp_path)), 6)
    gc.collect()
    cache = tmp_path / "cache"
    stream = batches_for(config(s3_text_data, tmp_path, f"data.local_cache={cache}"))
    assert all(same(a, b) for a, b in zip(draw(stream, 6), local, strict=True))
    copies = list(cache.glob("node0/*/train/shard.*.mds"))
    assert copies and len({path.parent.parent for path in copies}) == 1  # one cache per dataset


def test_validation_reads_the_buckets_val_split(s3_text_data, text_data, tmp_path):
    def first_batches(data):
        cfg = config(data, tmp_path, "eval.every=10")
        env = setup_distributed_env()
        loader = validation_loader(cfg, check_data(cfg, env), env, CPU)
        batches = [batch[0] for _, batch in zip(range(2), loader, strict=False)]
        loader.close()
        return batches

    for a, b in zip(first_batches(s3_text_data), first_batches(text_data), strict=True):
        assert torch.equal(a, b)


@pytest.fixture
def copy_of(s3_server, s3_text_data):
    """A copy of the bucket's dataset under another prefix, to damage."""
    def make(name: str) -> str:
        url = f"{s3_text_data}-{name}"
        for key in s3_server.objects(s3_text_data):
            s3_server.write(f"{url}/{key}", s3_server.read(f"{s3_text_data}/{key}"))
        return url
    return make


def test_a_shard_damaged_in_the_bucket_is_named_and_its_copy_removed(s3_server, copy_of,
                                                                     tmp_path):
    url = copy_of("flipped")
    index = json.loads(s3_server.read(f"{url}/train/index.json"))["shards"]
    damaged = f"{url}/train/{index[0]['raw_data']['basename']}"
    data = bytearray(s3_server.read(damaged))
    data[-1] ^= 0xFF  # same size: the listing cannot tell, the hash of the copy can
    s3_server.write(damaged, bytes(data))
    cache = tmp_path / "cache"
    stream = batches_for(config(url, tmp_path, f"data.local_cache={cache}", "data.num_workers=0"))
    with pytest.raises(RunFailure) as failure:
        draw(stream, 100)
    message = str(failure.value)
    assert message.startswith(f"the training data loader copied shard {damaged}, and its xxh64 "
                              "hash differs from the index's") and "\n" not in message
    assert not list(cache.glob(f"node0/*/train/{index[0]['raw_data']['basename']}"))


def test_a_truncated_shard_in_the_bucket_is_refused_before_the_run(s3_server, copy_of, tmp_path):
    url = copy_of("truncated")
    shard = f"{url}/train/shard.00000.mds"
    s3_server.write(shard, s3_server.read(shard)[:500])
    with pytest.raises(UsageError, match=f"shard {shard} is 500 bytes, the index says .* "
                                         rf"\(truncated\): .*data_prep/verify.py {url}"):
        check_data(config(url, tmp_path), setup_distributed_env())


@pytest.mark.parametrize("location, words", [
    ("s3://no-such-bucket/text", "the bucket no-such-bucket does not exist"),
    ("s3://aogpt-text/nothing-here", "has no manifest.json (not a finished aogpt data folder)"),
    ("ftp://host/text", "unknown scheme ftp://"),
], ids=["no bucket", "no manifest", "unknown scheme"])
def test_a_bad_remote_location_is_one_line_before_any_work(s3_text_data, tmp_path, location,
                                                           words):
    with pytest.raises(UsageError, match=re.escape(words)):
        check_data(config(location, tmp_path), setup_distributed_env())


def test_mixing_a_local_and_a_remote_stream_of_other_lengths_names_the_stream(
        s3_text_data, tmp_path):
    other = build_data(tmp_path / "long", real_documents()[:20], val_fraction=0.0,
                       extra=["--seq-len", "128"])
    streams = f"data.streams=[{{path: {s3_text_data}}}, {{path: {other}}}]"
    with pytest.raises(UsageError, match=f"^{other}: the data has samples of 128 tokens, the "
                                         "model's sequence length is 64"):
        check_data(config(s3_text_data, tmp_path, streams), setup_distributed_env())


@pytest.mark.slow  # waits its budget (tests/data_prep/test_remote_waits.py has the fast one)
def test_a_store_that_never_answers_is_one_line_within_its_budget(tmp_path, monkeypatch):
    with SilentServer() as server:
        for name, value in {**server.env, TIMEOUT_SETTING: "3"}.items():
            monkeypatch.setenv(name, value)
        started = time.monotonic()
        with pytest.raises(UsageError) as refused:
            check_data(config("s3://bucket/text", tmp_path), setup_distributed_env())
        assert time.monotonic() - started < 3 + 10
    assert str(refused.value).startswith(f"data location s3://bucket/text: the S3 endpoint "
                                         f"{server.url} did not answer in ")
    assert f"{TIMEOUT_SETTING}=3): check S3_ENDPOINT_URL" in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_evaluate_names_a_shard_damaged_in_the_bucket_in_one_line(s3_server, s3_synthetic_data,
                                                                   finished_run, tmp_path,
                                                                   monkeypatch, run_main):
    out, _ = finished_run
    url = f"{s3_synthetic_data}-damaged"
    for key in s3_server.objects(s3_synthetic_data):
        s3_server.write(f"{url}/{key}", s3_server.read(f"{s3_synthetic_data}/{key}"))
    damaged = f"{url}/val/shard.00000.mds"
    data = bytearray(s3_server.read(damaged))
    data[-1] ^= 0xFF  # same size: only the copy's hash can tell
    s3_server.write(damaged, bytes(data))
    bucket = {key: s3_server.read(f"{url}/{key}") for key in s3_server.objects(url)}
    run_files = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the evaluation's cache
    code, _, err = run_main(evaluate.main, "--ckpt", out, "--data", url, "--orders", "l2r",
                            "--max-samples", "8")
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: the evaluation data loader copied shard {damaged}, and its "
                           "xxh64 hash differs from the index's: its bytes are damaged at the "
                           "source (the copy was removed from the cache): re-copy the file, or "
                           f"rebuild the dataset with `python data_prep/synthetic_to_mds.py "
                           f"--out {url} --overwrite`"), line
    assert {key: s3_server.read(f"{url}/{key}") for key in s3_server.objects(url)} == bucket
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == run_files
    assert not list(tmp_path.glob("aogpt-eval-cache/*/shard.00000.mds"))


@pytest.mark.slow  # a server and a dataset of its own
def test_the_server_going_away_mid_run_ends_with_an_error_not_a_hang(tmp_path, monkeypatch):
    """Its own server (the session's stays up), shards of 16 samples so that most are still in
    the bucket when it stops (streaming copies 64 samples ahead here)."""
    server = S3Server()
    try:
        url = f"{server.bucket('going-away')}/text"
        build_data(url, real_documents()[:20], source_dir=tmp_path,
                   extra=["--samples-per-shard", "16", "--staging", str(tmp_path / "s")],
                   env={**os.environ, **server.env})
        for name, value in {**server.env, TIMEOUT_SETTING: "5"}.items():
            monkeypatch.setenv(name, value)
        stream = batches_for(config(url, tmp_path, "data.num_workers=0"))
        draw(stream, 1)
        server.stop()
        started = time.monotonic()
        with pytest.raises(RunFailure) as failure:
            draw(stream, 1000)
        assert time.monotonic() - started < 5 + 10  # the store may come back: tried 5 s
        assert str(failure.value).startswith(
            f"the training data loader cannot copy a shard from {url}/train (UsageError: data "
            f"{url}/train: the S3 endpoint {server.url} did not answer in ")
        assert "; AOGPT_S3_TIMEOUT_S=5): check S3_ENDPOINT_URL" in str(failure.value)
        assert "\n" not in str(failure.value)
    finally:
        server.stop()


# ---- whole runs (slow): 2-process DeepSpeed from the bucket -----------------------------------

STEPS = 12  # of the session's reference run (REFERENCE_STEPS), whose first 12 are this run's


def run_args(data, out, *overrides) -> list[str]:
    return reference_args(data, out, "ds_configs/cpu.json", f"train.max_steps={STEPS}",
                          *overrides)


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


def kill_after_checkpoint(launcher, args: list[str], out, step: int, log) -> None:
    """Starts a 2-process run and kills every process of it with -9 once checkpoint `step` is
    complete (a node lost, as abrupt as it gets)."""
    with log.open("w") as sink:
        # niced: the test must see the checkpoint and kill before the run goes much further,
        # also on a machine whose cores are all busy
        proc = subprocess.Popen(["nice", "-n", "15", *launcher.command("torchrun", args)],
                                cwd=REPO,
                                env=launcher.environment(), stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
        latest, deadline = out / "checkpoints" / "latest", time.monotonic() + 300
        while not (latest.is_file() and int(latest.read_text()[5:]) >= step):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        # torchrun starts its trainers in sessions of their own: every process of the tree
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for process in tree:
            process.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        _, alive = psutil.wait_procs(tree, timeout=60)
        assert not alive, alive


@pytest.mark.slow
def test_training_from_the_bucket_killed_and_resumed_elsewhere_is_the_local_folders_run(
        launcher, synthetic_data, s3_synthetic_data, reference_run, tmp_path):
    """The local folder's run (the session's reference: 2 processes, the same settings, 18 steps)
    against the same run from the bucket: killed with -9 after step 4's checkpoint (or soon
    after), resumed on 1 process for two steps (elastic), then on 2 to step 12. The data is the
    synthetic language (conftest.synthetic_data), uploaded."""
    local, _, _ = reference_run
    out = tmp_path / "bucket"
    args = run_args(s3_synthetic_data, out, "checkpoint.every=2")
    # Each launch has a node cache of its own, as a job requeued onto other nodes has (and a
    # killed run's shared-memory names for its cache would otherwise meet the next launch on
    # this one host, where other tests' datasets keep streaming's cleanup from reaching them).
    first = tmp_path / "cache1"
    kill_after_checkpoint(launcher, [*args, f"data.local_cache={first}"], out, 4,
                          tmp_path / "killed.log")
    assert list(first.glob("node0/*/train/shard.*.mds"))  # copied to this node's cache
    killed_at = int((out / "checkpoints" / "latest").read_text()[5:])
    assert killed_at <= STEPS - 4, "killed too late to resume twice"
    alone = subprocess.run([sys.executable, MAIN, *args, f"data.local_cache={tmp_path / 'c2'}",
                            f"train.max_steps={killed_at + 2}"], cwd=REPO,
                           env=launcher.environment(), capture_output=True, text=True,
                           timeout=600)
    assert_ok(alone)
    assert "elastic resume: step_0000000" in alone.stdout
    assert_ok(launcher.run("torchrun", [*args, f"data.local_cache={tmp_path / 'c3'}"]))
    expected, got = {s: v for s, v in losses(local).items() if s <= STEPS}, losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        # before the kill: the same world size, the same sums; after it, another partition of
        # the gradients sums in another order (~1e-7 relative; test_train_runs' elastic test)
        tolerance = 1e-6 if step <= killed_at else 1e-5
        assert got[step] == pytest.approx(expected[step], abs=tolerance), step
    evaluate = [sys.executable, "trainer/evaluate.py", "--ckpt", str(out), "--orders", "l2r",
                "--max-samples", "16", "--json"]
    for data, name in ((synthetic_data, "local.json"), (s3_synthetic_data, "bucket.json")):
        assert_ok(subprocess.run([*evaluate, str(tmp_path / name), "--data", str(data)],
                                 cwd=REPO, capture_output=True, text=True, timeout=300))
    scores = [json.loads((tmp_path / name).read_text())["results"][0]["l2r"]["nll"]
              for name in ("local.json", "bucket.json")]
    assert scores[0] == scores[1]
