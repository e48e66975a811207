"""Training never waits for its device between log boundaries: real 2-process DeepSpeed runs of
trainer/main.py on a CPU, with every wait that a GPU would pay recorded (device_syncs.py).

A wait drains the GPU's queue; the GPU then idles while the host loads the next micro-batch,
draws its orders and runs DeepSpeed's Python. So inside a step nothing may wait: not DeepSpeed's
throughput timer, not its gradient-norm checks, not our loss bookkeeping. The device is read at
log boundaries (metrics), evaluations and checkpoints only.

Since DeepSpeed no longer checks the gradient norm on the host (trainer/sync_free.py), the same
runs make one step's gradient NaN while its loss stays finite: the trainer's own check must
stop the run at the next boundary, naming that step's gradient norm.
"""

import json
import re
import subprocess

import pytest
import torch
from device_syncs import SyncLog, _Reads
from trainer_testing import REPO, SYNTHETIC_MODEL, Launcher

from aogpt.trainer.failsafe import EXIT_FAILED

LOG_EVERY, MAX_STEPS = 3, 7  # steps 1, 3 and 6 read the device; 2, 4, 5 must not
BOUNDARIES = {1, 3, 6, 7}
BAD_GRADIENT_STEP = 5  # its gradient is NaN, its loss finite: the run stops at step 6
RUN = [  # 2 ranks x 2 sequences of 64 x 2 accumulation steps: every micro-step path is taken
    # (of the synthetic language, conftest.synthetic_data: waits do not depend on the data)
    "model.block_size=64", SYNTHETIC_MODEL, "train.micro_batch_size=2", "train.tokens_per_step=512",
    f"train.log_every={LOG_EVERY}", f"train.max_steps={MAX_STEPS}", "eval.every=0",
    "checkpoint.every=100", "data.num_workers=1", "optim.warmup_steps=2",
    # the spike rule watches every step too (it judges them at the boundaries)
    "train.on_nonfinite=stop", "recovery.spike_factor=3", "recovery.spike_window=2",
]
# reads of values that live on the host in every run: the host group's signal flag, and torch's
# DataLoader seeding its workers from the host RNG when an epoch's iterator starts
HOST_VALUES = re.compile(r"^(dist_env\.py:\d+:any_rank|dataloader\.py:\d+:__init__)\b")
# DeepSpeed's ZeRO-3 waits for its own streams inside its parameter partitioning (every fetch of
# a layer's weights, every micro-step's gradient epilogue) and makes its norm's inf marker from
# host data: stage 3 is the only one whose step cannot be made free of waits by settings
ZERO3_MACHINERY = re.compile(r"^(partition_parameters|partitioned_param_coordinator|stage3)\.py:")


def waits_between_boundaries(ds_config: str, precision: str, data, tmp_path) -> list[dict]:
    """Runs 2 ranks under torchrun; the waits outside boundaries, over both ranks (after checking
    that the recording saw the boundaries' own reads). The ranks are what is recorded: the
    deepspeed launcher's two processes of its own would add ~4 s of CPU to each of the six runs,
    and nothing to what the ranks wait for."""
    log = tmp_path / "syncs"
    command = Launcher().command(
        "torchrun", ["--sync-log", str(log), "--bad-gradient-step", str(BAD_GRADIENT_STEP),
                      "--ds_config", f"ds_configs/{ds_config}.json", "--config",
                      "configs/tiny.yaml", f"data.path={data}", f"out_dir={tmp_path / 'run'}",
                      f"train.precision={precision}", *RUN],
        script=REPO / "tests" / "trainer" / "run_counting_syncs.py")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == EXIT_FAILED, output[-3000:]
    stopped = (f"error: the gradient norm is not finite at step {BAD_GRADIENT_STEP} (found at step "
               f"{BAD_GRADIENT_STEP + 1}): stopped without saving this step")
    assert stopped in output, output[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["step"] for r in metrics if "loss" in r] == [1, 3, 6]  # and the step before was
    events = []
    for rank in (0, 1):
        rank_events = json.loads((tmp_path / f"syncs.rank{rank}.json").read_text())
        # the metrics of a log boundary are read from the device: proof that reads are seen
        assert any(e["step"] == LOG_EVERY and e["kind"] == ".tolist()" for e in rank_events)
        events += [dict(e, rank=rank) for e in rank_events
                   if e["step"] not in BOUNDARIES | {0} and not HOST_VALUES.match(e["where"])]
    return events


def test_the_recording_sees_the_waits_only_a_cuda_device_has():
    log, x = SyncLog(), torch.arange(6.0)
    with _Reads(log):
        x[x > 2], x.nonzero(), x.repeat_interleave(torch.full((6,), 2))
        x[torch.arange(2)], x.masked_fill(x > 2, 0.0)  # none: no wait on any device
    assert [e["kind"].split(": ")[0] for e in log.events] == [
        "aten::index.Tensor", "aten::nonzero", "aten::repeat_interleave.Tensor"]


@pytest.mark.slow
@pytest.mark.parametrize("ds_config, precision", [
    ("cpu", "fp32"),  # the CPU default: ZeRO-1, an fp32 engine
    ("zero1", "bf16"),  # DeepSpeed's BF16_Optimizer (bf16 weights, fp32 gradient accumulation)
    ("zero1", "autocast_bf16"),  # a GPU's default: an fp32 engine, bf16 matmuls under autocast
    # an fp32 engine, as autocast_bf16 on a GPU: gradients reduced every micro-step
    ("zero2", "fp32"),
    ("zero2", "bf16"),  # ZeRO-2's bf16 path (its overflow check)
], ids=lambda value: value)
def test_between_log_boundaries_no_step_waits_for_the_device(ds_config, precision,
                                                             synthetic_data, tmp_path):
    assert waits_between_boundaries(ds_config, precision, synthetic_data, tmp_path) == []


@pytest.mark.slow
def test_zero3_waits_only_inside_deepspeeds_parameter_partitioning(synthetic_data, tmp_path):
    waits = waits_between_boundaries("zero3", "fp32", synthetic_data, tmp_path)
    assert waits, "ZeRO-3 waits for its streams: if it no longer does, update docs/performance.md"
    assert [w for w in waits if not ZERO3_MACHINERY.match(w["where"])] == []
