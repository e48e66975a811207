"""Train AO-GPT with DeepSpeed ZeRO on MDS shards.

    deepspeed --num_gpus 8 trainer/main.py --ds_config ds_configs/zero2.json \\
        --config configs/ao_gpt_small.yaml [key.sub=value ...]

Also runs under torchrun, under srun without a launcher (SLURM_* variables are mapped, export
MASTER_ADDR and MASTER_PORT), or as plain `python trainer/main.py` on one process. Re-running the
same command resumes from out_dir/checkpoints/latest. out_dir is a new or empty folder or the
run's own; a run that finished there (or whose checkpoints were deleted) is started again from
step 0 only with --start-over, which sets its files aside in out_dir/previous/ (trainer/out_dir.py).
Exit status: 0 done; 1 the run failed
while training (one line `error: ...` naming the cause: a shard the loader cannot read, a
non-finite loss, a lost rank, no checkpoint within checkpoint.signal_grace_s of a signal); 2 bad
input (one line saying what and how to fix it, before any heavy work; another training already
running in out_dir is one); 75 stopped by SIGTERM/SIGUSR1 or Ctrl-C after saving a checkpoint
(re-run, or requeue, to continue); 130 stopped by a second Ctrl-C without saving.
"""

from __future__ import annotations

import argparse
import sys
import time

from aogpt import RunFailure, UsageError, cli_entry
from aogpt.run_folder import RunFolder, step_of
from aogpt.trainer.config import record_config
from aogpt.trainer.dist_env import DistEnv, setup_distributed_env
from aogpt.trainer.failsafe import (
    EXIT_FAILED,
    EveryRankFailure,
    exit_deadline,
    first_line,
    is_collective_failure,
)
from aogpt.trainer.loop import Trainer
from aogpt.trainer.out_dir import START_OVER, set_aside
from aogpt.trainer.preflight import Plan, preflight
from aogpt.trainer.run_lock import RunLock

RANK0_REPORTS_FIRST_S = 5
EXIT_AFTER_FAILURE_S = 60  # a failing process is gone by then, whatever holds its exit


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ds_config", required=True, help="DeepSpeed JSON (ds_configs/*.json)")
    parser.add_argument("--config", required=True, help="run preset (configs/*.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="override any config value, e.g. train.max_steps=100")
    parser.add_argument(START_OVER, action="store_true",
                        help="start from step 0 even where out_dir holds a run (finished, or with "
                        "checkpoints): its files are moved to out_dir/previous/<time>/ first")
    parser.add_argument("--local_rank", type=int, default=None,
                        help=argparse.SUPPRESS)  # appended by the deepspeed launcher; env has it
    return parser.parse_args(argv)


def lock_run_folder(plan: Plan, dist_env: DistEnv) -> RunLock | None:
    """Rank 0 takes out_dir's lock once every check has passed (nothing is written before); a
    live holder is a UsageError. Then it records the launch in the folder (start_run_folder).
    The other ranks follow rank 0: if it stops, the launcher ends them."""
    if not dist_env.is_main:
        return None
    run = RunFolder(plan.cfg.out_dir)
    lock = RunLock(run.lock_file)
    lock.acquire()
    start_run_folder(plan, run)
    return lock


def start_run_folder(plan: Plan, run: RunFolder) -> None:
    """A run starting from step 0 sets aside what an earlier run left (else its metrics would
    hold the same steps twice; trainer/out_dir.py says when that needs --start-over); the config
    is recorded, with what a relaunch changed (config_changes.jsonl)."""
    if plan.resume_tag is None:
        moved = set_aside(run)
        if moved:
            folder, names = moved
            why = "as asked" if plan.start_over else "it holds no checkpoint"
            print(f"starting from step 0 ({why}): the earlier run's files are set aside in "
                  f"{folder}/ ({', '.join(names)})", flush=True)
    changed = record_config(plan.cfg, run.config_file, run.config_changes_file,
                            step_of(plan.resume_tag) if plan.resume_tag else 0, plan.git_sha)
    if changed:
        print("config changed since the run began: " + ", ".join(
            f"{key} {before!r} -> {now!r}" for key, (before, now) in changed.items())
            + f" (recorded in {run.config_changes_file})", flush=True)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dist_env = setup_distributed_env()
    try:
        plan = preflight(args.config, args.ds_config, args.overrides, dist_env,
                         args.start_over)
        lock = lock_run_folder(plan, dist_env)
    except UsageError:
        if dist_env.rank != 0:
            # Every rank meets the same problem; rank 0 alone says it. A launcher kills the other
            # ranks as soon as one fails, so give rank 0 the moment it needs to print first.
            time.sleep(RANK0_REPORTS_FIRST_S)
            return 2
        raise
    try:
        return train(plan, dist_env)
    finally:
        if lock is not None:
            lock.release()


def train(plan: Plan, dist_env: DistEnv) -> int:
    trainer = Trainer(plan, dist_env)
    try:
        return trainer.fit()
    except Exception as err:
        exit_deadline(EXIT_AFTER_FAILURE_S)
        trainer.close()  # loader workers ignore SIGTERM: they would hold the exit
        if isinstance(err, EveryRankFailure) and dist_env.rank != 0:
            # rank 0 says it (see above); the launcher's SIGTERM, sent once rank 0 has failed,
            # ends the wait
            trainer.preemption.wait(RANK0_REPORTS_FIRST_S)
            return EXIT_FAILED
        if is_collective_failure(err):  # another rank died or hung: it says why, if it can
            raise RunFailure(f"rank {dist_env.rank} lost the other ranks at step "
                             f"{trainer.progress.step + 1}"
                             f" ({first_line(err)}); the last complete checkpoint is "
                             f"{trainer.checkpointer.last_checkpoint()}") from None
        raise
    finally:
        trainer.close()


if __name__ == "__main__":
    sys.exit(main())
