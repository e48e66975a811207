"""trainer/main.py with every forward of the head checked against the weights it holds.

    python tests/trainer/run_checking_head_cast.py --cast-log OUT <trainer/main.py's arguments>

Under autocast the head casts its fp32 weights to bf16 once per optimizer step and reuses that
copy for the step's other micro-batches (model/gpt.py's LMHead). After each forward this records,
in OUT (JSON), the step it ran in, whether the forward used a kept copy, and whether that copy
was the weights it holds now, cast: a copy kept across an optimizer step or a rollback (a reload
of earlier weights) would not be.
"""

import json
import sys

import torch
from trainer_testing import take

from aogpt.model.gpt import LMHead
from aogpt.trainer import loop, main

records: list[dict] = []
step = [0]
forward, train_step = LMHead.forward, loop.Trainer.train_step


def checked_forward(self, hidden, targets=None, *args, **kwargs):
    kept = self._cast_weight
    out = forward(self, hidden, targets, *args, **kwargs)
    if targets is not None and self._cast_weight is not None:
        fresh = self.weight.detach().to(self._cast_weight.dtype)
        records.append({"step": step[0], "reused": self._cast_weight is kept,
                        "current": torch.equal(self._cast_weight, fresh)})
    return out


def counted_train_step(self, update):
    step[0] = update + 1
    return train_step(self, update)


LMHead.forward, loop.Trainer.train_step = checked_forward, counted_train_step

if __name__ == "__main__":
    args = sys.argv[1:]
    out = take(args, "--cast-log")
    status = main.main(args)
    with open(out, "w") as file:
        json.dump(records, file)
    sys.exit(status)
