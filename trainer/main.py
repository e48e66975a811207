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
from aogpt.data_prep.tokenizer import load_gpt2
from aogpt.model.run_folder import RunFolder, step_of
from aogpt.model.warm_start import check_source
from aogpt.trainer import speed, training_samples, zero_shot
from aogpt.trainer.checkpoint import check_resumable, read_run_state
from aogpt.trainer.config import RunConfig, load_config, record_config, resolve_device_choices
from aogpt.trainer.data import check_data
from aogpt.trainer.dist_env import DistEnv, setup_distributed_env
from aogpt.trainer.ds_config import load_ds_config, resolve_ds_config, sync_warnings, zero_stage
from aogpt.trainer.failsafe import (
    EXIT_FAILED,
    EveryRankFailure,
    exit_deadline,
    first_line,
    is_collective_failure,
)
from aogpt.trainer.judge import check_judge, check_judge_matches
from aogpt.trainer.loop import Plan, Trainer
from aogpt.trainer.out_dir import START_OVER, check_fresh_start, check_out_dir, set_aside
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


def preflight(args: argparse.Namespace, dist_env: DistEnv) -> Plan:
    """Every check that can fail on user input, cheap and before any process group exists."""
    cfg = load_config(args.config, args.overrides)
    resolve_device_choices(cfg, dist_env.device.type)
    cfg.validate(world_size=dist_env.world_size)
    check_out_dir(cfg.out_dir)
    ds_config = resolve_ds_config(load_ds_config(args.ds_config), cfg, dist_env.world_size)
    manifests = check_data(cfg, dist_env)
    if cfg.model.init_from:
        check_source(cfg.model.init_from, cfg.model)
    # each zero-shot set: there, made for this model, not empty; checked even when not scored
    sets = zero_shot.open_sets(cfg.eval.sets, cfg.model.block_size, cfg.eval.max_tokens,
                               cfg.model.vocab_size)
    if cfg.eval.sample_every:  # the sampler's settings, the tokenizer that decodes
        training_samples.sampling_config(cfg.eval, cfg.model.any_order)
        if cfg.model.reads_gpt2:
            load_gpt2()
    if cfg.eval.judge is not None:
        check_judge(cfg.eval.judge, "eval.judge")
        check_judge_matches(cfg.eval.judge, {"data_tokenizers": [
            manifest["tokenizer"] for manifest in manifests.values()]}, "eval.judge")
    run_folder = RunFolder(cfg.out_dir)
    tag, warning = (None, None) if args.start_over else run_folder.resume_tag()
    if tag is None and not args.start_over:
        check_fresh_start(run_folder)
    if dist_env.is_main:
        for line in filter(None, [*sync_warnings(ds_config), warning, *unused_settings(cfg),
                                  *speed.unavailable(cfg, dist_env.device)]):
            print(f"warning: {line}", file=sys.stderr, flush=True)
    elastic = False
    if tag is not None:
        state = read_run_state(run_folder, tag)
        elastic = check_resumable(state, cfg.model, dist_env.world_size, zero_stage(ds_config),
                                  run_folder.tag_dir(tag))
    if elastic:
        ds_config.setdefault("checkpoint", {})["load_universal"] = True
        if dist_env.is_main:
            print(f"elastic resume: {tag} was written by {state['world_size']} processes under "
                  f"ZeRO-{state['zero_stage']}, this run has {dist_env.world_size} under "
                  f"ZeRO-{zero_stage(ds_config)}: loading it as a universal checkpoint", flush=True)
    return Plan(cfg=cfg, ds_config=ds_config, manifests=manifests, resume_tag=tag, elastic=elastic,
                zero_shot_sets=sets if cfg.eval.every else {}, start_over=args.start_over)


def unused_settings(cfg: RunConfig) -> list[str]:
    """Settings given that another setting turns off: said at the start, not found out at the
    end."""
    lines = []
    if cfg.eval.sets and not cfg.eval.every:
        lines.append("eval.sets are not scored: eval.every=0 turns evaluation off")
    if cfg.eval.judge is not None and not cfg.eval.sample_every:
        lines.append("eval.judge is not used: eval.sample_every=0 draws no samples to judge")
    return lines


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
        plan = preflight(args, dist_env)
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
