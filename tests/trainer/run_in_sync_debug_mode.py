"""trainer/main.py with CUDA's sync debug mode set to "error" around every optimizer step but the
first: a step that makes the host wait for the GPU (a device value read, a blocking copy, an op
whose output size depends on the data) raises there, naming the op.

    python tests/trainer/run_in_sync_debug_mode.py <trainer/main.py's arguments>

The first step is left alone: it builds what later steps reuse (compiled graphs, DeepSpeed's
buffers, cuBLAS workspaces). The boundaries (logging, evaluation, checkpoints) read the device
by design after the step, outside the mode.
"""

import sys

import torch

from aogpt.trainer import loop, main

train_step = loop.Trainer.train_step


def strict_train_step(self, update):
    if update == 0:
        return train_step(self, update)
    torch.cuda.set_sync_debug_mode("error")
    try:
        return train_step(self, update)
    finally:
        torch.cuda.set_sync_debug_mode("default")


loop.Trainer.train_step = strict_train_step

if __name__ == "__main__":
    sys.exit(main.main(sys.argv[1:]))
