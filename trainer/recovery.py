"""Bad steps, and the way through them: train.on_nonfinite=rollback.

A step is bad when its loss or gradient norm is not finite (FirstNonFinite), or, with the spike
rule on (recovery.spike_factor > 0), when its loss is above spike_factor times the median loss of
the spike_window steps before it for spike_steps steps in a row (SpikeRule; the bad step is the
first of them). Both are read at the boundaries where the trainer reads the device anyway (a log,
an evaluation, a checkpoint): checking costs no device sync inside a step, and no checkpoint is
ever saved after a bad step that the check could already see.

`stop` (the default) ends the run there, naming the last complete checkpoint. `rollback`:

1. picks the newest complete checkpoint before the bad step; with none, the run stops (one line);
2. has the Checkpointer point `latest` at that checkpoint and remove the tags after it (they may
   hold weights of a spike: the rule speaks spike_steps steps after it began; the Checkpointer
   is the checkpoint folder's only writer), then appends the rollback to out_dir/rollbacks.json
   (the bad steps, why, the checkpoint, the learning-rate window);
3. reloads it on every rank (the loop restarts each part of the run from it), then trains on:
   when the run reaches the bad step again, the data stream first moves past the samples the bad
   steps were given (their dataset indices go to out_dir/skipped_samples.json and the step's
   metrics record `skipped_samples`), and the learning rate is multiplied by recovery.lr_factor
   from the checkpoint until recovery.lr_steps steps past the bad step;
4. gives up with one line, status 1, at a bad step after recovery.max_rollbacks rollbacks.

A test can make bad data with AOGPT_TEST_POISON (PoisonedSamples, a wrapper of the step's forward
that the trainer puts in place only then): the loss of chosen dataset samples is multiplied by a
factor (NaN by default) wherever the stream hands them out.

rollbacks.json is the whole memory of it: a run killed at any moment of a recovery and re-run
reads it and makes the same skips and the same learning rates, step for step, as one that was
never killed (tests/trainer/test_rollback.py). A kill before rollbacks.json is written leaves
`latest` at a tag before the bad step: the rerun finds the bad step again and rolls back alike.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from aogpt import UsageError
from aogpt.files import write_json_atomic
from aogpt.run_folder import RunFolder, step_of
from aogpt.trainer.checkpoint import Checkpointer, Progress
from aogpt.trainer.config import RecoveryConfig, RunConfig
from aogpt.trainer.data import TrainBatches
from aogpt.trainer.dist_env import DistEnv
from aogpt.trainer.failsafe import EveryRankFailure


@dataclass(frozen=True)
class BadStep:
    step: int  # the first bad step
    steps: int  # how many steps from it were bad: the data the stream moves past
    why: str  # "the loss is not finite at step 5", for messages


def first_bad(found: list[BadStep]) -> BadStep | None:
    return min(found, key=lambda bad: bad.step) if found else None


class FirstNonFinite:
    """The first step whose loss or gradient norm was not finite, on this rank, kept on the device.

    `note` runs every step and never reads the device (a GPU would drain its queue and idle while
    the host prepares the next micro-batch); `check` reads it, over all ranks, at the boundaries
    where the trainer reads the device anyway (logging, evaluation, a checkpoint): a run whose
    loss turns NaN goes on for at most log_every steps, and no checkpoint is ever saved after it.
    """

    def __init__(self, device: torch.device):
        # [first non-finite loss, first non-finite gradient norm]; inf = none yet
        self.steps = torch.full((2,), float("inf"), dtype=torch.float64, device=device)

    def note(self, step: int, loss_sums: torch.Tensor, grad_norm) -> None:
        """loss_sums: the step's nll sums; grad_norm: DeepSpeed's (a device tensor whose inf/NaN
        it marks -1; a number or None from an engine that computed none)."""
        bad_loss = ~torch.isfinite(loss_sums).all()
        bad_norm = torch.zeros_like(bad_loss)  # made on the device: no copy from the host
        if torch.is_tensor(grad_norm):
            bad_norm = (~torch.isfinite(grad_norm) | (grad_norm < 0)).reshape(())
        elif grad_norm is not None and not math.isfinite(grad_norm):
            bad_norm = ~bad_norm
        bad = torch.stack([bad_loss, bad_norm])
        torch.minimum(self.steps, torch.where(bad, float(step), float("inf")), out=self.steps)

    def check(self) -> tuple[int | None, int | None]:
        """(first non-finite loss step, first non-finite gradient norm step) over all ranks, None
        where there is none: a collective and a device read."""
        steps = self.steps.clone()
        if dist.is_initialized():
            dist.all_reduce(steps, op=dist.ReduceOp.MIN)
        return tuple(int(s) if math.isfinite(s) else None for s in steps.tolist())

    def bad_step(self) -> BadStep | None:
        """The first bad step by this rule (collective)."""
        loss_step, norm_step = self.check()
        return first_bad([BadStep(step, 1, f"the {what} is not finite at step {step}")
                          for step, what in ((loss_step, "loss"), (norm_step, "gradient norm"))
                          if step is not None])


class SpikeRule:
    """Loss above `factor` x the median of the `window` steps before it, `steps` steps in a row.

    Fed the global loss of every step in order (`add`); the rule speaks once the window is full.
    Its state (the window, the spike under way) goes into every checkpoint, so a resumed or
    rolled-back run judges the next steps exactly as the run that saved it would have."""

    def __init__(self, cfg: RecoveryConfig):
        self.factor, self.steps = cfg.spike_factor, cfg.spike_steps
        self.window: deque[float] = deque(maxlen=cfg.spike_window)
        self.spiking: list[tuple[int, float, float]] = []  # (step, loss, median) in a row

    def add(self, step: int, loss: float) -> BadStep | None:
        full = len(self.window) == self.window.maxlen
        median = statistics.median(self.window) if full else math.inf
        if math.isfinite(loss):  # a non-finite loss is FirstNonFinite's to report
            self.window.append(loss)
        if not loss > self.factor * median:
            self.spiking = []
            return None
        self.spiking.append((step, loss, median))
        if len(self.spiking) < self.steps:
            return None
        first, first_loss, first_median = self.spiking[0]
        in_a_row = f", {self.steps} steps in a row" if self.steps > 1 else ""
        return BadStep(first, self.steps, (
            f"the loss spiked at step {first} ({first_loss:.4g} > {self.factor:g} x the median "
            f"{first_median:.4g} of the {self.window.maxlen} steps before it{in_a_row})"))

    def state_dict(self) -> dict:
        return {"window": list(self.window), "spiking": [list(s) for s in self.spiking]}

    def load_state_dict(self, state: dict) -> None:
        self.window.clear()
        self.window.extend(state["window"])
        self.spiking = [tuple(s) for s in state["spiking"]]


class BadSteps:
    """Watches every step (`note`, on the device) and reports the first bad one (`check`, at a
    boundary, collective)."""

    def __init__(self, cfg: RecoveryConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.non_finite = FirstNonFinite(device)
        self.spikes = SpikeRule(cfg) if cfg.spike_factor else None
        self.pending: list[tuple[int, torch.Tensor]] = []  # (step, its loss sums) not yet judged

    def note(self, step: int, loss_sums: torch.Tensor, grad_norm) -> None:
        """Every step: its [l2r nll, l2r tokens, any-order nll, any-order tokens] on this rank."""
        self.non_finite.note(step, loss_sums, grad_norm)
        if self.spikes is not None:
            self.pending.append((step, loss_sums))

    def check(self) -> BadStep | None:
        """Collective: the first bad step since the run (or its last check) began, over all
        ranks."""
        found = [self.non_finite.bad_step()]
        if self.pending:
            sums = torch.stack([sums for _, sums in self.pending])  # (steps, 4)
            if dist.is_initialized():
                dist.all_reduce(sums)
            for (step, _), (l2r, l2r_tokens, ao, ao_tokens) in zip(self.pending, sums.tolist(),
                                                                   strict=True):
                found.append(self.spikes.add(step, (l2r + ao) / (l2r_tokens + ao_tokens)))
            self.pending = []
        return first_bad([bad for bad in found if bad is not None])

    def restart(self) -> None:
        """After a rollback: nothing seen yet of the steps to come (the spike rule's state comes
        back with the checkpoint)."""
        self.non_finite = FirstNonFinite(self.device)
        self.pending = []

    def state_dict(self) -> dict:
        """Take it after a check (the trainer checks before every save): nothing is pending."""
        return {"spikes": self.spikes.state_dict() if self.spikes is not None else None}

    def load_state_dict(self, state: dict | None) -> None:
        if self.spikes is not None and state and state.get("spikes") is not None:
            self.spikes.load_state_dict(state["spikes"])


class Rollbacks:
    """out_dir/rollbacks.json: every rollback of the run, and what each asks of the steps after
    it (the data to skip before a step, the learning-rate factor of a step)."""

    def __init__(self, run_folder: RunFolder, cfg: RecoveryConfig):
        self.file, self.skipped_file = run_folder.rollbacks_file, run_folder.skipped_samples_file
        self.cfg = cfg
        self.records: list[dict] = []
        if self.file.is_file():
            try:
                self.records = json.loads(self.file.read_text())["rollbacks"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise UsageError(f"{self.file} is unreadable ({err}): restore it, or delete it to "
                                 "resume without the skips it records") from None

    def __len__(self) -> int:
        return len(self.records)

    def add(self, bad: BadStep, found_at: int, rolled_back_to: str, to_step: int) -> dict:
        """Rank 0: records the rollback, durably (once `latest` has moved back)."""
        record = {"rollback": len(self.records) + 1, "bad_step": bad.step, "bad_steps": bad.steps,
                  "why": bad.why, "found_at_step": found_at, "rolled_back_to": rolled_back_to,
                  "from_step": to_step, "lr_factor": self.cfg.lr_factor,
                  "lr_until_step": bad.step + self.cfg.lr_steps}
        write_json_atomic({"rollbacks": [*self.records, record]}, self.file, durable=True)
        self.records.append(record)
        return record

    def adopt(self, record: dict) -> None:
        """Other ranks: the record rank 0 wrote."""
        self.records.append(record)

    def steps_to_skip(self, step: int) -> int:
        """How many steps' worth of data the stream moves past before `step`: those of every
        rollback whose bad steps began there (a second rollback to the same step skips the data
        that the first one's skip led to as well; a checkpoint saved after `step` holds the
        position past them all, and a run resumed from it never runs `step` again)."""
        return sum(record["bad_steps"] for record in self.records if record["bad_step"] == step)

    def lr_factor(self, step: int) -> float:
        """The product of the factors of every rollback whose window holds `step` (1-based)."""
        factor = 1.0
        for record in self.records:
            if record["from_step"] < step <= record["lr_until_step"]:
                factor *= record["lr_factor"]
        return factor

    def record_skip(self, step: int, sample_ids: list[int]) -> None:
        """Rank 0: the dataset indices skipped before `step`, by step (rewritten whole: a re-run
        that makes the same skip again writes the same entry)."""
        skipped = json.loads(self.skipped_file.read_text()) if self.skipped_file.is_file() else {}
        skipped[str(step)] = sorted(sample_ids)
        write_json_atomic(dict(sorted(skipped.items(), key=lambda item: int(item[0]))),
                          self.skipped_file, indent=None, durable=True)

    def summary(self) -> str:
        if not self.records:
            return ""
        skipped = (json.loads(self.skipped_file.read_text()) if self.skipped_file.is_file()
                   else {})
        samples = sum(len(ids) for ids in skipped.values())
        plural = "s" if len(self.records) > 1 else ""
        return (f"; {len(self.records)} rollback{plural}, {samples:,} samples skipped "
                f"({self.file}, {self.skipped_file})")


class Recovery:
    """The way through bad steps (see the module's docstring): watches every step, skips the data
    and lowers the learning rate that rollbacks ask for, and at a boundary answers a bad step by
    stopping the run or rolling it back."""

    def __init__(self, cfg: RunConfig, env: DistEnv, host_group, checkpointer: Checkpointer,
                 batches: TrainBatches, accum: int, bad_steps: BadSteps):
        """`bad_steps` is also one of the checkpointer's client parts: its state is saved with
        every checkpoint."""
        self.cfg, self.env, self.host_group = cfg, env, host_group
        self.checkpointer, self.batches, self.accum = checkpointer, batches, accum
        self.run_folder = checkpointer.run_folder
        self.bad_steps = bad_steps
        self.rollbacks = Rollbacks(self.run_folder, cfg.recovery)

    def note(self, step: int, loss_sums: torch.Tensor, grad_norm) -> None:
        self.bad_steps.note(step, loss_sums, grad_norm)

    def lr_factor(self, step: int) -> float:
        return self.rollbacks.lr_factor(step)

    def skip_bad_data(self, step: int) -> int:
        """Before `step`: moves the data stream past the samples of the bad steps that began
        there and records them (collective over the host group); how many were skipped."""
        steps = self.rollbacks.steps_to_skip(step)
        if not steps:
            return 0
        ids = self.batches.skip(steps * self.accum)
        every_rank = [ids]
        if self.env.world_size > 1:
            every_rank = [None] * self.env.world_size
            dist.all_gather_object(every_rank, ids, group=self.host_group)
        skipped = sorted(index for rank_ids in every_rank for index in rank_ids)
        if self.env.is_main:
            self.rollbacks.record_skip(step, skipped)
            print(f"step {step}: skipped {len(skipped)} samples, the data of {steps} bad "
                  f"step{'s' if steps > 1 else ''} (their indices in "
                  f"{self.rollbacks.skipped_file})", flush=True)
        return len(skipped)

    def answer(self, step: int, last: bool, preempted: bool, device_read: bool) -> Progress | None:
        """Collective, after every step: None when no step so far was bad, or when this step is no
        boundary (device_read: the loop read its values from the device, for a log, an
        evaluation or samples; or the Checkpointer saves it). Checked before every save, so no
        checkpoint ever holds weights updated by a bad step that could be seen. With
        train.on_nonfinite=stop a bad step ends the run; with rollback the run goes back to the
        last complete checkpoint before it (its Progress, every part of the run still to be
        restarted from it), or ends after max_rollbacks."""
        if not (device_read or self.checkpointer.due(step, last, preempted)):
            return None
        bad = self.bad_steps.check()
        if bad is None:
            return None
        why = bad.why + ("" if bad.step == step else f" (found at step {step})")
        stopped = "stopped without saving this step; the last complete checkpoint is"
        last_checkpoint = self.checkpointer.last_checkpoint()
        if self.cfg.train.on_nonfinite == "stop":
            raise EveryRankFailure(
                f"{why}: {stopped} {last_checkpoint} (lower optim.lr or raise optim.warmup_steps "
                "if it happens again, or set train.on_nonfinite=rollback)")
        done = len(self.rollbacks)
        if done >= self.cfg.recovery.max_rollbacks:
            raise EveryRankFailure(
                f"{why}, after {done} rollback{'s' if done > 1 else ''} "
                f"(recovery.max_rollbacks={self.cfg.recovery.max_rollbacks}, listed in "
                f"{self.rollbacks.file}): {stopped} {last_checkpoint}")
        # `latest` moves back first and the record is written last: a kill in between resumes
        # from the tag without the record, finds the bad step again and rolls back as a run never
        # killed did; a record never exists beside a later tag holding weights of the bad steps
        tag = self.checkpointer.rewind(bad.step)
        if tag is None:
            raise EveryRankFailure(
                f"{why}, and train.on_nonfinite=rollback has no complete checkpoint before it to "
                f"roll back to: {stopped} {last_checkpoint} (a smaller checkpoint.every saves one "
                "sooner; a larger checkpoint.keep_last keeps one from before a spike)")
        self.record(bad, why, tag, step)
        # collective: every rank's stream is back (TrainBatches.load_state_dict) when it returns
        return self.checkpointer.load(tag, elastic=False)

    def record(self, bad: BadStep, why: str, tag: str, found_at: int) -> None:
        """Collective: the rollback to `tag` recorded (by rank 0, then adopted by the others) for
        the steps to come, and said."""
        record = [None]
        if self.env.is_main:
            record = [self.rollbacks.add(bad, found_at, tag, step_of(tag))]
            lowered = (f"; optim.lr x{record[0]['lr_factor']:g} until step "
                       f"{record[0]['lr_until_step']}" if record[0]["lr_factor"] != 1 else "")
            bad_steps = (f"step {bad.step}" if bad.steps == 1
                         else f"steps {bad.step}-{bad.step + bad.steps - 1}")
            print(f"{why}: rolling back to {self.run_folder.tag_dir(tag)} (rollback "
                  f"{len(self.rollbacks)} of at most {self.cfg.recovery.max_rollbacks}); the data "
                  f"of {bad_steps} will be skipped{lowered}", flush=True)
        if self.env.world_size > 1:
            dist.broadcast_object_list(record, src=0, group=self.host_group)
        if not self.env.is_main:
            self.rollbacks.adopt(record[0])

    def restart(self, progress: Progress) -> None:
        """After a rollback to `progress`: nothing seen yet of the steps to come."""
        self.bad_steps.restart()

    def summary(self) -> str:
        return self.rollbacks.summary()


POISON_VARIABLE = "AOGPT_TEST_POISON"
# the training step's forward: (idx, orders, sample_ids) -> (per-token nll (micro, t), its mean)
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class PoisonedSamples:
    """A test-only hook around the step's forward: AOGPT_TEST_POISON="INDEX[:FACTOR],..."
    multiplies the per-token loss of those dataset samples by FACTOR (NaN when left out) wherever
    the stream hands them out, as bad data would (tests/trainer/test_rollback.py). Multiplied on
    the device: no sync. Without the variable the forward is used as it is: the step holds no
    test branch."""

    def __init__(self, forward: Forward, factors: dict[int, float], device: torch.device):
        self.forward = forward
        self.indices = torch.tensor(sorted(factors), dtype=torch.int64, device=device)
        self.factors = torch.tensor([factors[i] for i in sorted(factors)], dtype=torch.float32,
                                    device=device)

    @classmethod
    def around(cls, forward: Forward, device: torch.device) -> Forward:
        """`forward` poisoned as AOGPT_TEST_POISON asks, or `forward` itself without it."""
        spec = os.environ.get(POISON_VARIABLE, "").strip()
        if not spec:
            return forward
        factors = {}
        for item in spec.split(","):
            index, _, factor = item.partition(":")
            factors[int(index)] = float(factor or "nan")
        return cls(forward, factors, device)

    def __call__(self, idx: torch.Tensor, orders: torch.Tensor, sample_ids: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward's nll (micro, t) of samples sample_ids (micro,), poisoned, and its mean."""
        nll, _ = self.forward(idx, orders, sample_ids)
        hit = sample_ids[:, None] == self.indices  # (micro, poisoned)
        factor = torch.where(hit, self.factors, 1.0).prod(dim=1)  # (micro,)
        nll = nll * factor[:, None].to(nll.dtype)
        return nll, nll.mean()
