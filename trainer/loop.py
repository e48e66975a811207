"""The training run: a DeepSpeed engine over AOGPT, fed by the streaming loader, one optimizer step
at a time, with the components that act around the steps.

    trainer = Trainer(plan, dist_env)  # builds everything, resumes from `latest` if present
    exit_code = trainer.fit()  # trains to train.max_steps, exports final/ (model.safetensors)

`fit` is a short loop that hands each step to its components, each of which keeps its own
schedule and does its own work: the TrainingLog (trainer/metrics.py: log lines, metrics.jsonl),
the Validator (trainer/validator.py: validation, zero-shot sets, samples; it returns its metrics
and log lines), the Recovery (trainer/recovery.py: bad steps, and the decision to roll back), the
Checkpointer (trainer/checkpoint.py: saves, resume, final/, and the checkpoint folder's rewind
for a rollback: the folder's only writer) and the preemption flag (trainer/failsafe.py: signals,
Ctrl-C). A rollback hands the loop the Progress of the checkpoint it reloaded (the engine, the
EMA, the data stream and the RNGs are back with it), and the loop restarts each other component
from it (`restart(progress)`). Steps are counted as completed optimizer updates: after update i
(0-based, the index the LR schedule and the order sampler see), the run is at step i + 1, which
is what metrics, checkpoint tags and `latest` report.

The host never waits for the device inside a step: the loss sums, the bad-step watch and the
EMA stay on the device, DeepSpeed's step is made sync-free (trainer/sync_free.py), and signals
are agreed on over a host (gloo) group. The device is read at log, evaluation and checkpoint
boundaries only, so a GPU always has the next micro-batch queued while the host prepares one
more (tests/trainer/test_trainer_syncs.py counts).
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import deepspeed
import torch
from deepspeed.utils import set_z3_leaf_modules

from aogpt.model import AOGPT
from aogpt.model.gpt import Block
from aogpt.model.orders import ANY_ORDER, LEFT_TO_RIGHT, prediction_weights
from aogpt.model.planned_orders import TrainingOrders
from aogpt.model.warm_start import warm_start
from aogpt.trainer import speed
from aogpt.trainer.checkpoint import Checkpointer, Progress
from aogpt.trainer.config import RunConfig, config_to_dict
from aogpt.trainer.data import TrainBatches, training_locations
from aogpt.trainer.dist_env import DistEnv, all_reduce_sum, any_rank, host_group, init_process_group
from aogpt.trainer.ds_config import zero_stage
from aogpt.trainer.ema import ShardedEMA
from aogpt.trainer.failsafe import EXIT_PREEMPTED, PreemptionFlag, SignalWatchdog
from aogpt.trainer.lr_schedule import learning_rate
from aogpt.trainer.metrics import TrainingLog, Window, loss_key, peak_flops
from aogpt.trainer.preflight import Plan
from aogpt.trainer.recovery import BadSteps, PoisonedSamples, Recovery
from aogpt.trainer.sync_free import install as make_deepspeed_steps_sync_free
from aogpt.trainer.validator import Validator, token_weighted


class Trainer:
    def __init__(self, plan: Plan, dist_env: DistEnv):
        self.cfg = cfg = plan.cfg
        self.ds_config, self.env, self.device = plan.ds_config, dist_env, dist_env.device
        self.manifests = plan.manifests
        self.preemption = PreemptionFlag(announce=dist_env.is_main)
        self.host_group = join_the_run(cfg, self.device)
        self.accum = cfg.gradient_accumulation_steps(dist_env.world_size)
        model = build_model(cfg, self.device, resumed=plan.resume_tag is not None,
                            announce=dist_env.is_main)
        self.num_params = model.num_params()
        self.flops_per_token = model.flops_per_token(cfg.model.block_size)
        self.flops_per_token_causal = model.flops_per_token(cfg.model.block_size, causal=True)
        self.attention_backend = model.attention_backend
        self.peak_flops = (peak_flops(torch.cuda.get_device_name(self.device))
                           if self.device.type == "cuda" else None)  # for the MFU
        self.engine = start_engine(model, cfg, self.ds_config, self.device)
        self.forward = PoisonedSamples.around(self.micro_batch_loss, self.device)
        self.ema = ShardedEMA(self.engine, cfg.ema.decay) if cfg.ema.enabled else None
        speed.fuse_ema(self.engine, self.ema, cfg)
        self.reduction = speed.Reduction(self.engine, cfg.speed.coalesce_grad_reduction)
        weights = prediction_weights(cfg.order, cfg.model.block_size)  # None: the plain mean
        self.weights = None if weights is None else weights.to(self.device)
        self.batches = TrainBatches(cfg, plan.manifests, dist_env, self.device)
        self.validator = Validator(cfg, dist_env, self.engine, self.ema, plan.manifests,
                                   plan.zero_shot_sets, Path(cfg.out_dir))
        self.orders = training_orders(cfg, self.engine.module, self.validator)
        bad_steps = BadSteps(cfg.recovery, self.device)  # its spike rule's state is checkpointed
        self.checkpointer = Checkpointer(
            cfg, dist_env, self.engine, self.ema, self.ds_config,
            {"loader": self.batches, "recovery": bad_steps}, plan.git_sha,
            [manifest["tokenizer"] for manifest in plan.manifests.values()], self.host_group)
        self.recovery = Recovery(cfg, dist_env, self.host_group, self.checkpointer, self.batches,
                                 self.accum, bad_steps)
        self.watchdog = SignalWatchdog(cfg.checkpoint.signal_grace_s,
                                       self.checkpointer.last_checkpoint, announce=dist_env.is_main)
        self.lr, self.skipped_now = 0.0, 0  # of the step just run
        self.progress = (self.checkpointer.load(plan.resume_tag, plan.elastic) if plan.resume_tag
                         else Progress())

    def describe(self) -> str:
        cfg, env = self.cfg, self.env
        return (
            f"model: {cfg.model.n_layer} layers x {cfg.model.n_embd}, "
            f"{self.num_params / 1e6:.2f}M parameters, attention {self.attention_backend}"
            f"{f', compiled per {cfg.train.compile_scope}' if cfg.train.compile else ''} | "
            f"ZeRO-{zero_stage(self.ds_config)} {cfg.train.precision} on {self.device.type} | "
            f"world size {env.world_size} ({env.local_world_size} per node) | per step: "
            f"{cfg.train.micro_batch_size} sequences x {self.accum} accumulation x "
            f"{env.world_size} ranks = {cfg.sequences_per_step} x {cfg.model.block_size} tokens | "
            f"orders: {cfg.order.describe()} | EMA: "
            f"{cfg.ema.decay if cfg.ema.enabled else 'off'} | out_dir: {cfg.out_dir}"
        )

    def describe_data(self) -> str:
        """The training data's size and how many times the run reads it: a run of many epochs on
        a small dataset is said, not found out from its curves."""
        cfg, locations = self.cfg, [location for location, _ in training_locations(self.cfg)]
        samples = sum(self.manifests[location]["splits"]["train"].get("samples", 0)
                      for location in locations)
        planned = cfg.train.max_steps * cfg.sequences_per_step
        epochs = f", {planned / samples:,.2f} epochs" if samples else ""
        return (f"data: {samples:,} training samples of {cfg.model.block_size} tokens in "
                f"{', '.join(locations)} | {cfg.train.max_steps:,} steps x "
                f"{cfg.sequences_per_step} sequences = {planned:,} samples{epochs}")

    def close(self) -> None:
        """Ends the loaders' worker processes: nothing of the run outlives it (trainer/main.py)."""
        self.batches.close()
        self.validator.close()

    # ---- one optimizer step ----------------------------------------------------------------------

    def train_step(self, update: int) -> tuple[torch.Tensor, float]:
        """Runs optimizer update `update` (0-based) over `accum` micro-batches.

        Returns this rank's [nll sum, tokens] of its left-to-right and any-order samples (a
        float64 vector of 4, on the device, not yet reduced) and the seconds spent waiting for data.
        """
        self.lr = learning_rate(update, self.cfg.optim) * self.recovery.lr_factor(update + 1)
        speed.set_lr(self.engine.optimizer, self.lr)
        self.skipped_now = self.recovery.skip_bad_data(update + 1)
        # changed by the last step: cast them once for this one
        self.engine.module.lm_head.weights_changed()
        sums = torch.zeros(4, dtype=torch.float64, device=self.device)
        data_wait = 0.0
        with self.reduction.micro_steps():
            for _ in range(self.accum):
                start = time.perf_counter()
                idx, sample_ids = next(self.batches)  # (micro, t), (micro,)
                data_wait += time.perf_counter() - start
                # Orders key on (step, the sample's index in the dataset): they never depend on
                # the rank or micro-batch a sample lands in, whatever the world size.
                orders, is_l2r = self.orders(update, sample_ids, idx)
                speed.micro_step_begins(self.engine, self.cfg, self.device)
                nll, loss = self.forward(idx, orders, sample_ids)  # (micro, t), scalar
                self.engine.backward(loss)
                self.reduction.after_backward()
                with torch.no_grad():
                    per_sample = nll.detach().double().sum(dim=1)  # (micro,)
                    tokens = is_l2r.double() * nll.shape[1]
                    sums += torch.stack([(per_sample * is_l2r).sum(), tokens.sum(),
                                         (per_sample * ~is_l2r).sum(),
                                         nll.shape[1] * idx.shape[0] - tokens.sum()])
        self.recovery.note(update + 1, sums, self.engine.get_global_grad_norm())
        if self.ema is not None:
            self.ema.update()
        return sums, data_wait

    def micro_batch_loss(self, idx: torch.Tensor, orders: torch.Tensor,
                         sample_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The network's per-token loss (micro, t) of a micro-batch of the dataset samples
        `sample_ids` (micro,) in `orders`, and its mean (what backward takes): weighted by
        order.weighting's prediction weights where it makes any."""
        return self.engine(idx, orders, return_mean=True, weights=self.weights)

    # ---- the loop --------------------------------------------------------------------------------

    def fit(self) -> int:
        """Trains to train.max_steps; the exit status (EXIT_PREEMPTED when a signal stopped it)."""
        cfg, checkpointer = self.cfg, self.checkpointer
        self.say(self.describe(), self.describe_data())
        if self.progress.step >= cfg.train.max_steps:
            self.say(f"already at step {self.progress.step} >= "
                     f"train.max_steps={cfg.train.max_steps}")
            checkpointer.publish_final(self.progress)
            return 0
        log = TrainingLog(cfg, self.env.rank, self.progress.step, config_to_dict(cfg))
        self.validator.start_clock()
        with log:
            while self.progress.step < cfg.train.max_steps:
                log.begin_step()
                sums, data_wait = self.train_step(self.progress.step)
                self.progress.advance(cfg.train.tokens_per_step, cfg.sequences_per_step)
                step, last = self.progress.step, self.progress.step == cfg.train.max_steps
                logged = log.advance(step, data_wait, asked=bool(self.skipped_now))
                record = log.step(step, self.step_metrics(sums, log.window)) if logged else {}
                validation = self.validator.after_step(step, last)
                log.write(step, {**record, **validation.metrics}, validation.lines)
                # a host collective: which rank was signalled needs no device value
                preempted = any_rank(self.preemption.requested, self.host_group)
                rolled_back = self.recovery.answer(step, last, preempted, logged or validation.ran)
                if rolled_back:  # the same steps again, from a checkpoint before the bad one
                    self.progress = rolled_back
                    for part in (log, self.validator, self.recovery):
                        part.restart(rolled_back)
                    continue
                if saved := checkpointer.save(self.progress, last, preempted):
                    log.say(f"step {step} | checkpoint {saved}")
                if preempted:
                    self.watchdog.saved()
                    why = self.preemption.received or "a signal to another rank"
                    log.say(f"stopping at step {step} on {why}: checkpoint saved, re-run the "
                            "same command to resume")
                    return EXIT_PREEMPTED
        checkpointer.publish_final(self.progress)
        lines = log.summary(checkpointer.run_folder, self.progress, self.validator.summary())
        self.say(lines[0] + self.recovery.summary(), *lines[1:])
        return 0

    def say(self, *lines: str) -> None:
        """Lines of the log, on rank 0 (outside a launch's step bar)."""
        if self.env.is_main:
            print(*lines, sep="\n", flush=True)

    def step_metrics(self, sums: torch.Tensor, window: Window) -> dict:
        """The metrics record of a logged step, over the log interval `window` (collective)."""
        total = all_reduce_sum(sums, self.device).tolist()  # also waits for the step to finish
        seconds = window.seconds  # read once: the clock runs on
        tokens_per_s = window.tokens / seconds
        grad_norm = self.engine.get_global_grad_norm()
        return {
            "loss": token_weighted(total[0] + total[2], total[1] + total[3]),
            loss_key(LEFT_TO_RIGHT): token_weighted(total[0], total[1]),
            loss_key(ANY_ORDER): token_weighted(total[2], total[3]),
            "lr": self.lr,
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_device": tokens_per_s / self.env.world_size,
            "samples_seen": self.progress.samples_seen,
            "tokens_seen": self.progress.tokens_seen,
            "step_time": seconds / window.steps,
            "data_wait": window.data_wait / window.steps,
            **self.mfu(tokens_per_s),
            "memory_gb": (torch.cuda.max_memory_allocated(self.device) / 2**30
                          if self.device.type == "cuda" else None),
            **({"skipped_samples": self.skipped_now, "rollbacks": len(self.recovery.rollbacks)}
               if self.skipped_now else {}),
            **(self.orders.cost.report(window.steps) if self.orders.planned else {}),
        }

    def mfu(self, tokens_per_s: float) -> dict:
        """MFU both ways: "mfu" counts attention whole (6N + 12 L d T per token), "mfu_causal"
        halves it for causal attention (6N + 6 L d T, Megatron's and MaxText's count)."""
        peak = self.peak_flops * self.env.world_size if self.peak_flops else None
        return {"mfu": self.flops_per_token * tokens_per_s / peak if peak else None,
                "mfu_causal": self.flops_per_token_causal * tokens_per_s / peak if peak else None}


def join_the_run(cfg: RunConfig, device: torch.device) -> torch.distributed.ProcessGroup:
    """This process's setup before anything of the run is built: the device chosen, the process
    group joined (a collective that waits longer than train.collective_timeout_s for a hung rank
    fails), DeepSpeed's step made sync-free. Returns the host (gloo) group."""
    quiet_third_party_logs()
    if device.type == "cuda":  # before the process group, so NCCL binds the right GPU
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    init_process_group(cfg.train.collective_timeout_s)
    group = host_group()
    make_deepspeed_steps_sync_free()
    return group


def build_model(cfg: RunConfig, device: torch.device, resumed: bool, announce: bool) -> AOGPT:
    """The network, with the same initial weights on every rank, or those of model.init_from
    when the run starts (a resumed run loads its own)."""
    torch.manual_seed(cfg.train.seed)
    model = AOGPT(cfg.model).to(device)
    if cfg.model.init_from and not resumed:
        started_from = warm_start(model, cfg.model.init_from)
        if announce:
            print(f"model.init_from: started from the {started_from}", flush=True)
    return model


def training_orders(cfg: RunConfig, module: AOGPT, validator: Validator) -> TrainingOrders:
    """Each step's orders (a planner's need the network being trained: `module`, or with
    order.planner_weights=ema the validator's copy of the EMA's weights at that step, which
    evaluation at the end of the step before has already made), compiled with the step where it
    is."""
    ema_copy = ((lambda update: validator.model(update, "ema"))
                if cfg.order.planner_weights == "ema" else None)
    orders = TrainingOrders(cfg.order, cfg.model.block_size, cfg.train.seed, module, ema_copy)
    if cfg.train.compile:
        orders.compile()
    return orders


def start_engine(model: AOGPT, cfg: RunConfig, ds_config: dict,
                 device: torch.device) -> deepspeed.DeepSpeedEngine:
    """The DeepSpeed engine over `model` (compiled first when train.compile) and its AdamW, with
    the speed section's levers (trainer/speed.py)."""
    speed.compile_model(model, cfg, device)
    optimizer = speed.adamw(model, cfg)
    if zero_stage(ds_config) == 3:
        # each block's weights gathered once, around the whole block, not around each of its
        # layers: with a hook on every layer, a compiled block broke its graph at each one and
        # dynamo compiled DeepSpeed's hook code too (28 graphs for a 2-layer model, not 5)
        set_z3_leaf_modules(model, [Block])
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=speed.engine_ds_config(ds_config, cfg, device))
    speed.compile_engine(engine, cfg, device)
    return engine


def quiet_third_party_logs() -> None:
    """DeepSpeed logs every config key at INFO on every rank; keep warnings and errors."""
    deepspeed.utils.logger.setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
