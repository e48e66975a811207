"""trainer/main.py with every wait for the device recorded (tests/trainer/device_syncs.py).

    deepspeed --num_gpus 2 tests/trainer/run_counting_syncs.py --sync-log OUT <trainer/main.py's arguments>

Each rank writes OUT.rank<r>.json: the events, each with the optimizer step it happened in (the
step that train_step(update) completes, update + 1; 0 before the first).
"""

import json
import os
import sys

from device_syncs import SyncLog, install

log = SyncLog()
reads = install(log)  # before the trainer is built: DeepSpeed makes its streams at set-up

from aogpt.trainer import loop, main  # noqa: E402  (after the patches, on purpose)

train_step = loop.Trainer.train_step


def counted_train_step(self, update):
    log.step = update + 1
    return train_step(self, update)


loop.Trainer.train_step = counted_train_step

if __name__ == "__main__":
    args = sys.argv[1:]
    at = args.index("--sync-log")
    out = args[at + 1]
    del args[at:at + 2]
    with reads:
        status = main.main(args)
    with open(f"{out}.rank{os.environ.get('RANK', '0')}.json", "w") as file:
        json.dump(log.events, file)
    sys.exit(status)
