"""trainer/main.py with rank 1 slow to load the loader's position, and each rank's moments kept.

    python tests/trainer/run_with_a_slow_rank_1_load.py --moments OUT <trainer/main.py's arguments>

Rank 1 waits 3 s before it loads a checkpoint's loader state (streaming keeps that position in a
shared-memory block which one rank of a node creates and the others attach to). Each rank writes
OUT.rank<R>.json: when it finished loading that state, and when it went on to the training loop.
"""

import json
import os
import sys
import time

from trainer_testing import take

from aogpt.trainer import data, loop, main

RANK = int(os.environ.get("RANK", "0"))
moments: dict[str, float] = {}
load_state_dict, fit = data.TrainBatches.load_state_dict, loop.Trainer.fit


def slow_load_state_dict(self, state):
    if RANK == 1:
        time.sleep(3)
    load_state_dict(self, state)
    moments["loaded"] = time.time()


def timed_fit(self):
    moments["fit"] = time.time()
    return fit(self)


data.TrainBatches.load_state_dict, loop.Trainer.fit = slow_load_state_dict, timed_fit

if __name__ == "__main__":
    args = sys.argv[1:]
    out = take(args, "--moments")
    status = main.main(args)
    with open(f"{out}.rank{RANK}.json", "w") as file:
        json.dump(moments, file)
    sys.exit(status)
