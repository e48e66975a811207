"""The training run: a DeepSpeed engine over AOGPT, fed by the streaming loader, one optimizer step
at a time, with the EMA, validation, checkpoints and metrics around it.

    trainer = Trainer(plan, dist_env)    # builds everything, resumes from `latest` if present
    exit_code = trainer.fit()            # trains to train.max_steps, exports final/ (model.safetensors)

Steps are counted as completed optimizer updates: after `fit` has run update i (0-based, the
index the LR schedule and the order sampler see), the run is at step i + 1, which is what
metrics, checkpoint tags and `latest` report.

The host never waits for the device inside a step: the loss sums, the non-finite check and the
EMA stay on the device, DeepSpeed's step is made sync-free (trainer/sync_free.py), and signals
are agreed on over a host (gloo) group. The device is read at log, evaluation and checkpoint
boundaries only, so a GPU always has the next micro-batch queued while the host prepares one
more (tests/trainer/test_trainer_syncs.py counts).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import deepspeed
import deepspeed.comm as dist
import torch

from aogpt import RunFailure
from aogpt.files import fsync_path, git_sha, write_json_atomic, write_text_atomic
from aogpt.model import AOGPT, OrderSampler, save_consolidated
from aogpt.model.checkpoint import copy_consolidated, read_consolidated
from aogpt.model.run_folder import WEIGHTS_FILE, RunFolder, step_of, tag_for
from aogpt.model.warm_start import warm_start
from aogpt.trainer import zero_shot
from aogpt.trainer.checkpoint import (
    RUN_STATE,
    commit_tag,
    load_rank_state,
    prune_tags,
    rank_files,
    rank_state_file,
    restore_rng_states,
    rng_states,
    save_torch_atomic,
)
from aogpt.trainer.config import RunConfig, config_to_dict, record_config
from aogpt.trainer.data import TrainBatches, clean_stale_shared_memory, validation_loader
from aogpt.trainer.dist_env import DistEnv, all_reduce_sum, any_rank, host_group, init_process_group
from aogpt.trainer.ds_config import zero_stage
from aogpt.trainer.ema import ShardedEMA, gather_full_weights, load_full_ema
from aogpt.trainer.evaluation import EvalData, Evaluator
from aogpt.trainer.failsafe import EXIT_PREEMPTED, EveryRankFailure, PreemptionFlag, SignalWatchdog
from aogpt.trainer.lr_schedule import learning_rate
from aogpt.trainer.metrics import (
    MetricsLogger,
    peak_flops,
    step_line,
    summary_lines,
    training_bar,
    truncate_metrics,
    validation_line,
)
from aogpt.trainer.recovery import BadStep, BadSteps, PoisonedSamples, Rollbacks
from aogpt.trainer.sync_free import install as make_deepspeed_steps_sync_free
from aogpt.trainer.training_samples import TrainingSamples


@dataclass
class Plan:
    """Everything checked before the heavy work starts (trainer/main.py's pre-flight)."""

    cfg: RunConfig
    ds_config: dict
    manifests: dict[str, dict]
    resume_tag: str | None
    elastic: bool = False  # the tag was written by another number of processes or ZeRO stage
    zero_shot_sets: dict[str, EvalData] = dataclasses.field(default_factory=dict)  # by name


def token_weighted(nll_sum: float, tokens: float) -> float | None:
    return nll_sum / tokens if tokens else None


class Trainer:
    def __init__(self, plan: Plan, dist_env: DistEnv):
        self.cfg = cfg = plan.cfg
        self.ds_config = plan.ds_config
        self.env = dist_env
        self.preemption = PreemptionFlag(announce=dist_env.is_main)
        self.watchdog = SignalWatchdog(cfg.checkpoint.signal_grace_s, self.last_checkpoint,
                                       announce=dist_env.is_main)
        quiet_third_party_logs()
        self.device = dist_env.device
        if self.device.type == "cuda":  # before the process group, so NCCL binds the right GPU
            torch.cuda.set_device(self.device)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        init_process_group(cfg.train.collective_timeout_s)  # a hung rank fails the others
        self.host_group = host_group()
        make_deepspeed_steps_sync_free()
        clean_stale_shared_memory()  # a killed run's leftovers would break the loader
        self.accum = cfg.gradient_accumulation_steps(dist_env.world_size)
        self.run_folder = RunFolder(cfg.out_dir)
        self.git_sha = git_sha()
        if dist_env.is_main:
            self.note_the_run_folder(plan)

        torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
        model = AOGPT(cfg.model).to(self.device)
        if cfg.model.init_from and plan.resume_tag is None:  # a resumed run loads its own weights
            started_from = warm_start(model, cfg.model.init_from)
            if dist_env.is_main:
                print(f"model.init_from: started from the {started_from}", flush=True)
        self.num_params = model.num_params()
        self.flops_per_token = model.flops_per_token(cfg.model.block_size)
        self.attention_backend = model.attention_backend
        if cfg.train.compile:
            model.compile_for_training(cfg.train.compile_scope)
        optimizer = torch.optim.AdamW(
            model.param_groups(cfg.optim.weight_decay), lr=cfg.optim.lr,
            betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps,
            fused=True,  # one kernel per step, and its step count stays on the device (no .item())
        )
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                    config=self.ds_config)
        self.ema = ShardedEMA(self.engine, cfg.ema.decay) if cfg.ema.enabled else None
        self.sampler = OrderSampler(cfg.order, cfg.model.block_size, cfg.train.seed)
        if cfg.train.compile:
            self.sampler.compile()
        self.batches = TrainBatches(cfg, plan.manifests, dist_env, self.device)
        self.val_loader = (validation_loader(cfg, plan.manifests, dist_env, self.device)
                           if cfg.eval.every else None)
        self.zero_shot_sets = plan.zero_shot_sets
        # the weights every evaluation scores: the EMA's (the paper's), the raw ones when asked
        self.eval_weights = ["ema"] if self.ema is not None else ["raw"]
        if cfg.eval.raw_weights and self.ema is not None and self.zero_shot_sets:
            self.eval_weights.append("raw")
        self._eval_model: AOGPT | None = None
        self._eval_model_holds: tuple[int, str] | None = None  # (step, weights) it was loaded with
        self._last_eval = time.perf_counter()
        self.samples = (TrainingSamples(cfg.eval, cfg.model.any_order, cfg.model.block_size,
                                        self.run_folder.root, self.device)
                        if cfg.eval.sample_every and dist_env.is_main else None)
        self.bad_steps = BadSteps(cfg.recovery, self.device)
        self.rollbacks = Rollbacks(self.run_folder, cfg.recovery)
        self.poison = PoisonedSamples.from_environment(self.device)
        self.lr = 0.0  # of the step just run
        self.skipped_now = 0  # samples the stream moved past before the step just run (a rollback's)
        # what the run had seen at the step it started this launch from: another
        # train.tokens_per_step after a resume counts from there
        self.seen_at = {"step": 0, "tokens_seen": 0, "samples_seen": 0}
        self.step = self.resume(plan.resume_tag, plan.elastic) if plan.resume_tag else 0

    # ---- set-up ---------------------------------------------------------------------------------

    def resume(self, tag: str, elastic: bool) -> int:
        """Loads a complete tag; elastic: written by another number of processes or ZeRO stage."""
        folder = self.run_folder.tag_dir(tag)
        load_dir = self.universal_checkpoint(tag) if elastic else self.run_folder.checkpoints
        load_path, client = self.engine.load_checkpoint(str(load_dir), tag=tag)
        if load_path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {load_dir / tag}")
        if elastic:
            dist.barrier()  # every rank has read the universal form
            if self.env.is_main:
                shutil.rmtree(load_dir, ignore_errors=True)
        self.batches.load_state_dict(client["loader"])
        self.bad_steps.load_state_dict(client.get("recovery"))
        # another partitioning has other rank files: rank 0's carries what all ranks share
        rank_state = load_rank_state(rank_state_file(folder, 0 if elastic else self.env.rank))
        if self.ema is not None and rank_state["ema"] is not None:
            if elastic:  # the shard layout changed: reshard from the consolidated EMA
                ema = read_consolidated(folder, weights=("ema",))["weights"]["ema"]
                load_full_ema(self.ema, ema, rank_state["ema"]["num_updates"])
            else:
                self.ema.load_state_dict(rank_state["ema"])
        elif self.ema is not None:  # the run so far had ema.enabled=false
            self.ema = ShardedEMA(self.engine, self.cfg.ema.decay)  # from the resumed weights
            if self.env.is_main:
                print("the checkpoint has no EMA: it starts now, from the resumed weights", flush=True)
        if not elastic:  # (elastically, each rank's RNG, used by dropout only, starts from the seed)
            restore_rng_states(rank_state["rng"])
        self.seen_at = {key: client[key] for key in ("step", "tokens_seen", "samples_seen")}
        if self.env.is_main:
            truncate_metrics(self.run_folder.metrics_file, client["step"])
            print(f"resumed from {folder} at step {client['step']}", flush=True)
        return client["step"]

    def note_the_run_folder(self, plan: Plan) -> None:
        """Rank 0, before anything is written: a run starting from step 0 replaces what an earlier
        attempt left without a checkpoint (else its metrics would hold the same steps twice); the
        config is recorded, with what a relaunch changed (config_changes.jsonl)."""
        run = self.run_folder
        if plan.resume_tag is None:
            earlier = [path for path in (run.metrics_file, run.config_file, run.config_changes_file,
                                         run.rollbacks_file, run.skipped_samples_file)
                       if path.is_file()]
            if earlier:
                print(f"starting from step 0: {run.root} holds no checkpoint, so the files of an "
                      f"earlier attempt are replaced ({', '.join(p.name for p in earlier)})",
                      flush=True)
            for path in earlier:
                path.unlink()
        changed = record_config(self.cfg, run.config_file, run.config_changes_file,
                                step_of(plan.resume_tag) if plan.resume_tag else 0, self.git_sha)
        if changed:
            print("config changed since the run began: " + ", ".join(
                f"{key} {before!r} -> {now!r}" for key, (before, now) in changed.items())
                + f" (recorded in {run.config_changes_file})", flush=True)

    def universal_checkpoint(self, tag: str) -> Path:
        """Rank 0 converts the tag with DeepSpeed's ds_to_universal; the folder to load from."""
        out = self.run_folder.universal
        if self.env.is_main:
            shutil.rmtree(out, ignore_errors=True)
            done = subprocess.run(
                [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                 "--input_folder", str(self.run_folder.tag_dir(tag)), "--output_folder",
                 str(out / tag), "--inject_missing_state",  # tags saved before this field existed
                 "--num_extract_workers", "2", "--num_merge_workers", "1"],
                capture_output=True, text=True)
            if done.returncode:
                lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
                raise RunFailure(f"converting {self.run_folder.tag_dir(tag)} to a universal "
                                 f"checkpoint failed: {lines[-1]}")
        dist.barrier()
        return out

    def describe(self) -> str:
        cfg, env = self.cfg, self.env
        return (
            f"model: {cfg.model.n_layer} layers x {cfg.model.n_embd}, "
            f"{self.num_params / 1e6:.2f}M parameters, attention {self.attention_backend}"
            f"{f', compiled per {cfg.train.compile_scope}' if cfg.train.compile else ''} | "
            f"ZeRO-{zero_stage(self.ds_config)} "
            f"{cfg.train.precision} on {self.device.type} | world size "
            f"{env.world_size} ({env.local_world_size} per node) | per step: "
            f"{cfg.train.micro_batch_size} sequences x {self.accum} accumulation x "
            f"{env.world_size} ranks = {cfg.sequences_per_step} x {cfg.model.block_size} tokens | "
            f"orders: {cfg.order.kind}"
            f"{f' (p_left_to_right {cfg.order.p_left_to_right})' if cfg.order.kind == 'mixture' else ''}"
            f" | EMA: "
            f"{cfg.ema.decay if cfg.ema.enabled else 'off'} | out_dir: {self.run_folder.root}"
        )

    def last_checkpoint(self) -> str:
        """The complete checkpoint a re-run resumes from, for messages."""
        tag = self.run_folder.latest_tag()
        return str(self.run_folder.tag_dir(tag)) if tag else "none yet"

    def close(self) -> None:
        """Ends the loaders' worker processes: nothing of the run outlives it (trainer/main.py)."""
        self.batches.close()
        if self.val_loader is not None:
            self.val_loader.close()

    # ---- one optimizer step -----------------------------------------------------------------------

    def train_step(self, update: int) -> tuple[torch.Tensor, float]:
        """Runs optimizer update `update` (0-based) over `accum` micro-batches.

        Returns this rank's [nll sum, tokens] of its left-to-right and any-order samples (a
        float64 vector of 4, on the device, not yet reduced) and the seconds spent waiting for data.
        """
        cfg = self.cfg
        self.lr = learning_rate(update, cfg.optim) * self.rollbacks.lr_factor(update + 1)
        for group in self.engine.optimizer.param_groups:
            group["lr"] = self.lr
        self.skip_bad_data(update + 1)
        self.engine.module.lm_head.weights_changed()  # by the last step: cast them once for this one
        sums = torch.zeros(4, dtype=torch.float64, device=self.device)
        data_wait = 0.0
        for _ in range(self.accum):
            start = time.perf_counter()
            idx, sample_ids = next(self.batches)  # (micro, t), (micro,)
            data_wait += time.perf_counter() - start
            # Orders key on (step, the sample's index in the dataset): they never depend on the
            # rank or micro-batch a sample lands in, whatever the world size.
            orders, is_l2r = self.sampler(update, sample_ids)
            nll, loss = self.engine(idx, orders, return_mean=True)  # (micro, t), scalar
            if self.poison is not None:  # a test's bad data
                nll, loss = self.poison(nll, sample_ids)
            self.engine.backward(loss)
            self.engine.step()  # DeepSpeed steps the optimizer on the last micro-step only
            with torch.no_grad():
                per_sample = nll.detach().double().sum(dim=1)  # (micro,)
                tokens = is_l2r.double() * nll.shape[1]
                sums += torch.stack([(per_sample * is_l2r).sum(), tokens.sum(),
                                     (per_sample * ~is_l2r).sum(),
                                     nll.shape[1] * idx.shape[0] - tokens.sum()])
        self.bad_steps.note(update + 1, sums, self.engine.get_global_grad_norm())
        if self.ema is not None:
            self.ema.update()
        return sums, data_wait

    # ---- evaluation -------------------------------------------------------------------------------

    def full_weights(self, ema: bool, everywhere: bool = True) -> dict[str, torch.Tensor]:
        """Full fp32 weights (collective); EMA ones when asked and kept. Only rank 0 gets them
        unless `everywhere`: the others need no copy to export."""
        if ema and self.ema is not None:
            with self.ema.swapped_in():
                return gather_full_weights(self.engine, keep=everywhere or self.env.is_main)
        return gather_full_weights(self.engine, keep=everywhere or self.env.is_main)

    def eval_model(self, weights: str, everywhere: bool = True) -> AOGPT | None:
        """Collective: a plain copy of the network holding this step's `weights` ("ema" or
        "raw"); the engine's own weights stay untouched. Only rank 0 gets one unless
        `everywhere` (the others get None). What every rank was given once in a step is reused
        in that step (a round of samples after an evaluation): every rank decides alike."""
        if self._eval_model_holds == (self.step, weights):
            return self._eval_model
        full = self.full_weights(ema=weights == "ema", everywhere=everywhere)
        self._eval_model_holds = (self.step, weights) if everywhere else None
        if not (everywhere or self.env.is_main):
            return None
        if self._eval_model is None:
            with torch.device(self.device):
                self._eval_model = AOGPT(self.cfg.model).eval()
        self._eval_model.load_state_dict(full)
        return self._eval_model

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        """Collective: the validation losses (the first weights of eval_weights), each zero-shot
        set under each of eval_weights (trainer/zero_shot.py), and what the round cost."""
        cfg, env = self.cfg, self.env
        start = time.perf_counter()
        record = {}
        for weights in self.eval_weights:
            model = self.eval_model(weights)
            settings = zero_shot.settings(model, self.eval_precision, cfg.train.micro_batch_size,
                                          cfg.eval.num_orders)
            evaluator = Evaluator(model, settings, self.device, env.rank, env.world_size)
            if weights == self.eval_weights[0]:
                record.update(self.validate(evaluator))
            for name, data in self.zero_shot_sets.items():
                record.update(zero_shot.score(evaluator, data, weights, name))
        end = time.perf_counter()
        record["eval_s"] = end - start
        record["eval_fraction"] = (end - start) / max(end - self._last_eval, 1e-9)
        self._last_eval = end
        return record

    def sample(self) -> dict[str, float]:
        """Collective (the weights are gathered): rank 0 draws, writes and scores a round of
        samples of the first of eval_weights (trainer/training_samples.py); its metrics."""
        weights = self.eval_weights[0]
        model = self.eval_model(weights, everywhere=False)
        if self.samples is None:
            return {}
        return self.samples.round(model, self.step, weights)

    @property
    def eval_precision(self) -> str:
        return "fp32" if self.cfg.train.precision == "fp32" else "bf16"

    def validate(self, evaluator: Evaluator) -> dict[str, float | None]:
        """val_loss_l2r and val_loss_ao (token-weighted over eval.num_orders seeded orders) on the
        val split, scored by the routine of trainer/evaluate.py (Evaluator.score_batch)."""
        cfg, env = self.cfg, self.env
        tallies, sampler = evaluator.new_tallies(), evaluator.order_sampler(cfg.model.block_size)
        micro = cfg.train.micro_batch_size
        with evaluator.autocast():
            for batch_index, (idx, _) in enumerate(self.val_loader):
                if batch_index == cfg.eval.batches:
                    break
                idx = idx.to(self.device)  # (b, t)
                first = (batch_index * env.world_size + env.rank) * micro
                sample_indices = torch.arange(first, first + len(idx), device=self.device)
                lengths = torch.full_like(sample_indices, idx.shape[1])  # no padding in training data
                evaluator.score_batch(sampler, tallies, sample_indices, idx, lengths)
        l2r = tallies["l2r"].sums  # (nll, tokens)
        any_order = tallies["random"].sums.sum(dim=0) if "random" in tallies else torch.zeros_like(l2r)
        total = all_reduce_sum(torch.cat([l2r, any_order]), self.device).tolist()
        return {"val_loss_l2r": token_weighted(total[0], total[1]),
                "val_loss_ao": token_weighted(total[2], total[3])}

    # ---- checkpoints ------------------------------------------------------------------------------

    def export(self, folder: Path) -> None:
        """Consolidated raw + EMA weights into `folder`, written by rank 0 (collective)."""
        raw = self.full_weights(ema=False, everywhere=False)
        ema = self.full_weights(ema=True, everywhere=False) if self.ema is not None else None
        if self.env.is_main:
            save_consolidated(folder, self.cfg.model, raw, ema, **self.run_meta(),
                              source="aogpt trainer")

    def publish_final(self) -> None:
        """out_dir/final/: a copy of the last checkpoint's consolidated weights (collective only
        when that checkpoint is not of the current step and the weights must be gathered)."""
        saved = self.run_folder.tag_dir(tag_for(self.step))
        if not (saved / WEIGHTS_FILE).is_file():
            self.export(self.run_folder.final)
        elif self.env.is_main:
            copy_consolidated(saved, self.run_folder.final)

    @property
    def tokens_seen(self) -> int:
        return (self.seen_at["tokens_seen"]
                + (self.step - self.seen_at["step"]) * self.cfg.train.tokens_per_step)

    @property
    def samples_seen(self) -> int:
        return (self.seen_at["samples_seen"]
                + (self.step - self.seen_at["step"]) * self.cfg.sequences_per_step)

    def run_meta(self) -> dict:
        return {"step": self.step, "tokens_seen": self.tokens_seen,
                "samples_seen": self.samples_seen, "git_sha": self.git_sha,
                "run_config": config_to_dict(self.cfg)}

    def save_checkpoint(self) -> bool:
        """Collective: the tag is complete or absent (trainer/checkpoint.py); False when it was
        there already. A failed write (a full disk) removes what it wrote and ends the run, naming
        the checkpoint still intact."""
        tag = tag_for(self.step)
        if self.run_folder.problem(tag) is None:
            return False  # resumed from this very step: nothing has changed since
        work = self.run_folder.partial_dir(tag)
        if self.env.is_main and work.exists():
            shutil.rmtree(work)  # a save of this step that was interrupted earlier
        dist.barrier()
        try:
            self.write_tag(work)
            for path in rank_files(work, self.env.rank):
                fsync_path(path)
        except OSError as err:
            if self.env.is_main:
                shutil.rmtree(work, ignore_errors=True)
            intact = self.run_folder.latest_tag()
            raise RunFailure(
                f"saving checkpoint {tag} failed ({err.strerror or err}): "
                + (f"{self.run_folder.tag_dir(intact)} is intact, free space and re-run to resume "
                   "from it" if intact else "no earlier checkpoint exists, free space and re-run")
            ) from None
        dist.barrier()  # every rank's files are on disk
        if self.env.is_main:
            commit_tag(self.run_folder, tag)
            prune_tags(self.run_folder, self.cfg.checkpoint.keep_last)
        dist.barrier()
        return True

    def write_tag(self, folder: Path) -> None:
        """Collective: every file of a checkpoint into `folder` (see trainer/checkpoint.py)."""
        self.export(folder)
        folder.mkdir(parents=True, exist_ok=True)
        rank_state = {"ema": self.ema.state_dict() if self.ema is not None else None,
                      "rng": rng_states()}
        save_torch_atomic(rank_state, rank_state_file(folder, self.env.rank))
        if self.env.is_main:
            write_json_atomic({**self.run_meta(), "world_size": self.env.world_size,
                               "zero_stage": zero_stage(self.ds_config),
                               "model_config": dataclasses.asdict(self.cfg.model)},
                              folder / RUN_STATE)
        client_state = {**self.run_meta(), "loader": self.batches.state_dict(),
                        "recovery": self.bad_steps.state_dict(),
                        "model_config": dataclasses.asdict(self.cfg.model)}
        self.engine.save_checkpoint(str(folder.parent), tag=folder.name,
                                    client_state=client_state, save_latest=False)

    # ---- the loop ---------------------------------------------------------------------------------

    def fit(self) -> int:
        cfg, env = self.cfg, self.env
        if env.is_main:
            print(self.describe(), flush=True)
        if self.step >= cfg.train.max_steps:
            if env.is_main:
                print(f"already at step {self.step} >= train.max_steps={cfg.train.max_steps}",
                      flush=True)
            self.publish_final()
            return 0
        logger = MetricsLogger(self.run_folder.root, env.rank, cfg.logging, config_to_dict(cfg))
        on_gpu = self.device.type == "cuda"
        peak = peak_flops(torch.cuda.get_device_name(self.device)) if on_gpu else None
        bar = training_bar(env.rank, cfg.train.max_steps, self.step)
        say = bar.write if env.is_main else lambda line: None
        launch_start = window_start = self._last_eval = time.perf_counter()
        window_steps, window_wait, trained = 0, 0.0, 0
        last_record, last_validation = {}, {}
        try:
            while self.step < cfg.train.max_steps:
                sums, data_wait = self.train_step(self.step)
                self.step += 1
                trained += 1
                window_steps += 1
                window_wait += data_wait
                bar.update(1)
                last = self.step == cfg.train.max_steps
                record = {}
                if (self.step % cfg.train.log_every == 0 or self.step == 1 or last
                        or self.skipped_now):
                    record = self.step_metrics(sums, window_start, window_steps, window_wait, peak)
                    window_start, window_steps, window_wait = time.perf_counter(), 0, 0.0
                    last_record = record
                    per_step = (time.perf_counter() - launch_start) / trained
                    say(step_line(record, self.step, cfg.train.max_steps,
                                        per_step * (cfg.train.max_steps - self.step)))
                if cfg.eval.every and (self.step % cfg.eval.every == 0 or last):
                    evaluation = self.evaluate()
                    record.update(evaluation)
                    last_validation = evaluation
                    say(validation_line(evaluation, self.step, self.eval_weights[0]))
                    if self.zero_shot_sets:
                        say(f"step {self.step} | " + zero_shot.describe(
                            record, list(self.zero_shot_sets), self.eval_weights[0]))
                sampled = cfg.eval.sample_every and (self.step % cfg.eval.sample_every == 0
                                                     or last)
                if sampled:
                    record.update(self.sample())
                if record:
                    logger.log(self.step, **record)
                # a host collective: which rank was signalled needs no device value
                preempted = any_rank(self.preemption.requested, self.host_group)
                save = self.step % cfg.checkpoint.every == 0 or last or preempted
                if (record or save or sampled) and self.answer_bad_step():  # boundaries, where the
                    # device is read anyway; rolled back: on from the checkpoint's step
                    logger.reopen()
                    bar.reset(total=cfg.train.max_steps)
                    bar.update(self.step)
                    window_start, window_steps, window_wait = time.perf_counter(), 0, 0.0
                    continue
                if save and self.save_checkpoint():
                    say(f"step {self.step} | checkpoint {self.run_folder.tag_dir(tag_for(self.step))}")
                if preempted:
                    self.watchdog.saved()
                    say(f"stopping at step {self.step} on "
                              f"{self.preemption.received or 'a signal to another rank'}: "
                              f"checkpoint saved, re-run the same command to resume")
                    return EXIT_PREEMPTED
        finally:
            bar.close()
            logger.close()
        self.publish_final()
        if env.is_main:
            lines = summary_lines(self.run_folder, self.step, self.tokens_seen,
                                  time.perf_counter() - launch_start,
                                  trained * cfg.train.tokens_per_step, last_record,
                                  last_validation, self.eval_weights[0])
            lines[0] += self.rollbacks.summary()
            print("\n".join(lines), flush=True)
        return 0

    def answer_bad_step(self) -> bool:
        """Collective, at a boundary: whether a step so far was bad (trainer/recovery.py). Checked
        before every save, so no checkpoint ever holds weights updated by a bad step that could
        be seen. With train.on_nonfinite=stop a bad step ends the run; with rollback the run goes
        back to the last complete checkpoint before it (True), or ends after max_rollbacks."""
        bad = self.bad_steps.check()
        if bad is None:
            return False
        why = bad.why + ("" if bad.step == self.step else f" (found at step {self.step})")
        stopped = "stopped without saving this step; the last complete checkpoint is"
        if self.cfg.train.on_nonfinite == "stop":
            raise EveryRankFailure(
                f"{why}: {stopped} {self.last_checkpoint()} (lower optim.lr or raise "
                "optim.warmup_steps if it happens again, or set train.on_nonfinite=rollback)")
        done = len(self.rollbacks)
        if done >= self.cfg.recovery.max_rollbacks:
            raise EveryRankFailure(
                f"{why}, after {done} rollback{'s' if done > 1 else ''} "
                f"(recovery.max_rollbacks={self.cfg.recovery.max_rollbacks}, listed in "
                f"{self.rollbacks.file}): {stopped} {self.last_checkpoint()}")
        target = self.checkpoint_before(bad.step)
        if target is None:
            raise EveryRankFailure(
                f"{why}, and train.on_nonfinite=rollback has no complete checkpoint before it to "
                f"roll back to: {stopped} {self.last_checkpoint()} (a smaller checkpoint.every "
                "saves one sooner; a larger checkpoint.keep_last keeps one from before a spike)")
        self.roll_back(bad, why, target)
        return True

    def checkpoint_before(self, step: int) -> str | None:
        """Collective: the newest complete tag saved before `step`, as rank 0 finds it."""
        found = [None]
        if self.env.is_main:
            complete = [tag for tag in self.run_folder.tags()
                        if step_of(tag) < step and self.run_folder.problem(tag) is None]
            found = [complete[-1] if complete else None]
        if self.env.world_size > 1:
            dist.broadcast_object_list(found, src=0, group=self.host_group)
        return found[0]

    def roll_back(self, bad: BadStep, why: str, tag: str) -> None:
        """Collective: back to checkpoint `tag`, with the rollback recorded for the steps to come.

        `latest` moves first and the record is written last: a kill in between resumes from
        `tag` without the record, finds the bad step again and rolls back as a run never killed
        did; a record never exists beside a later tag holding weights of the bad steps."""
        record = [None]
        if self.env.is_main:
            write_text_atomic(self.run_folder.latest_file, tag, durable=True)
            for later in self.run_folder.tags():
                if step_of(later) > step_of(tag):  # saved after the bad step (a spike's)
                    shutil.rmtree(self.run_folder.tag_dir(later))
            record = [self.rollbacks.add(bad, self.step, tag, step_of(tag))]
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
        self.step = self.resume(tag, elastic=False)
        self.bad_steps.restart()
        self._eval_model_holds = None  # the same step numbers will hold other weights
        dist.barrier()  # every rank's data stream is back before any draws from it

    def skip_bad_data(self, step: int) -> None:
        """Before `step`: moves the data stream past the samples of the bad steps that began
        there (a rollback's, trainer/recovery.py) and records them."""
        steps = self.rollbacks.steps_to_skip(step)
        self.skipped_now = 0
        if not steps:
            return
        ids = self.batches.skip(steps * self.accum)
        every_rank = [ids]
        if self.env.world_size > 1:
            every_rank = [None] * self.env.world_size
            dist.all_gather_object(every_rank, ids, group=self.host_group)
        skipped = sorted(index for rank_ids in every_rank for index in rank_ids)
        self.skipped_now = len(skipped)
        if self.env.is_main:
            self.rollbacks.record_skip(step, skipped)
            print(f"step {step}: skipped {len(skipped)} samples, the data of {steps} bad "
                  f"step{'s' if steps > 1 else ''} (their indices in "
                  f"{self.rollbacks.skipped_file})", flush=True)

    def step_metrics(self, sums: torch.Tensor, window_start: float, window_steps: int,
                     window_wait: float, peak: float | None) -> dict:
        cfg = self.cfg
        total = all_reduce_sum(sums, self.device).tolist()  # also waits for the step to finish
        elapsed = time.perf_counter() - window_start
        tokens_per_s = window_steps * cfg.train.tokens_per_step / elapsed
        grad_norm = self.engine.get_global_grad_norm()
        return {
            "loss": token_weighted(total[0] + total[2], total[1] + total[3]),
            "loss_l2r": token_weighted(total[0], total[1]),
            "loss_ao": token_weighted(total[2], total[3]),
            "lr": self.lr,
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_device": tokens_per_s / self.env.world_size,
            "samples_seen": self.samples_seen,
            "tokens_seen": self.tokens_seen,
            "step_time": elapsed / window_steps,
            "data_wait": window_wait / window_steps,
            "mfu": (self.flops_per_token * tokens_per_s / (peak * self.env.world_size)
                    if peak else None),
            "memory_gb": (torch.cuda.max_memory_allocated(self.device) / 2**30
                          if self.device.type == "cuda" else None),
            **({"skipped_samples": self.skipped_now, "rollbacks": len(self.rollbacks)}
               if self.skipped_now else {}),
        }


def quiet_third_party_logs() -> None:
    """DeepSpeed logs every config key at INFO on every rank; keep warnings and errors."""
    deepspeed.utils.logger.setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
