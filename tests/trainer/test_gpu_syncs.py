"""On a GPU, no training step after the first makes the host wait for the device: real runs of
trainer/main.py with CUDA's sync debug mode set to "error" around steps 2..k
(run_in_sync_debug_mode.py), under the default recipe (ZeRO-1, compiled) in autocast_bf16 and
bf16. What the CPU runs of test_trainer_syncs.py find by the code that would wait, this finds by
the waits themselves, with DeepSpeed's CUDA accelerator and the CUDA kernels."""

import subprocess
import sys

import pytest
from trainer_testing import REPO

pytestmark = pytest.mark.gpu
RUN = [  # 2 micro-batches per step, steps 2-5 between the boundaries of steps 1 and 6
    "model.block_size=64", "train.micro_batch_size=4", "train.tokens_per_step=512",
    "train.max_steps=6", "train.log_every=100", "eval.every=0", "checkpoint.every=100",
    "data.num_workers=1", "optim.warmup_steps=2", "logging.wandb='off'",
]


@pytest.mark.parametrize("precision", ["autocast_bf16", "bf16"])
def test_no_step_after_the_first_waits_for_the_gpu(precision, text_data, tmp_path):
    command = [sys.executable, str(REPO / "tests" / "trainer" / "run_in_sync_debug_mode.py"),
               "--ds_config", "ds_configs/zero1.json", "--config", "configs/tiny.yaml",
               f"data.path={text_data}", f"out_dir={tmp_path / 'run'}",
               f"train.precision={precision}", *RUN]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (tmp_path / "run" / "final").is_dir()
