"""trainer/main.py with every wait for the device recorded (tests/trainer/device_syncs.py).

    torchrun --nproc_per_node 2 tests/trainer/run_counting_syncs.py --sync-log OUT
        [--bad-gradient-step K] <trainer/main.py's arguments>

Each rank writes OUT.rank<r>.json: the events, each with the optimizer step it happened in (the
step that train_step(update) completes, update + 1; 0 before the first). With
--bad-gradient-step, the gradient of the head's weight turns NaN in step K's backward passes
while the loss stays finite: what DeepSpeed's step no longer checks on the host
(trainer/sync_free.py), and the trainer's own check must find at its next boundary.
"""

import json
import os
import sys

from device_syncs import SyncLog, install

log = SyncLog()
reads = install(log)  # before the trainer is built: DeepSpeed makes its streams at set-up

from trainer_testing import take  # noqa: E402  (after the patches too: it imports aogpt.trainer)

from aogpt.trainer import loop, main  # noqa: E402  (after the patches, on purpose)

train_step = loop.Trainer.train_step
bad_gradient_step = None


def counted_train_step(self, update):
    log.step = update + 1
    if log.step != bad_gradient_step:
        return train_step(self, update)
    hook = self.engine.module.lm_head.weight.register_hook(lambda grad: grad * float("nan"))
    try:
        return train_step(self, update)
    finally:
        hook.remove()


loop.Trainer.train_step = counted_train_step


if __name__ == "__main__":
    args = sys.argv[1:]
    out = take(args, "--sync-log")
    bad_gradient_step = int(take(args, "--bad-gradient-step") or 0) or None
    with reads:
        status = main.main(args)
    with open(f"{out}.rank{os.environ.get('RANK', '0')}.json", "w") as file:
        json.dump(log.events, file)
    sys.exit(status)
