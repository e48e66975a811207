# shellcheck shell=bash
# The one launch behind slurm/train_small.sh and slurm/train_medium.sh (they set defaults and
# source this file; the settings are documented at the top of each template).
#
# How the processes start: srun runs one task per node, and each task is a torchrun that starts
# one trainer process per GPU; the nodes meet through torchrun's c10d rendezvous hosted on the
# first node of the allocation. Chosen over the deepspeed
# launcher with a hostfile because
#   - no ssh/pdsh between nodes and no hostfile: srun already places one task on every node;
#   - torchrun exports LOCAL_WORLD_SIZE, which streaming needs to count nodes (the deepspeed
#     launcher sets LOCAL_SIZE instead);
#   - the command is the same on every node (no node rank to compute per task);
#   - torchrun passes a signal on to the trainers and waits for them to checkpoint
#     (--signals-to-handle, --shutdown-timeout), which the preemption protocol below needs.
# deepspeed.initialize runs under torchrun as under its own launcher.
#
# Preemption: the template asks SLURM for SIGUSR1 on the batch shell some minutes before the
# time limit (#SBATCH --signal=B:USR1@300). The shell turns it into a SIGTERM to every process
# of the training step (scancel --signal=TERM: all steps, not the shell), the signal that a
# preemption or the time limit itself would send: the trainers take it as "checkpoint at the
# next step boundary and exit", torchrun passes it on and waits for them, and helper processes
# (loader workers, Python's resource tracker, wandb) survive it, which they would not a USR1.
# The shell waits for the step to end, then requeues the job (scontrol requeue), and the
# requeued job runs the same command, which resumes from the checkpoint's `latest`.
# A SIGTERM from SLURM itself (scancel, preemption without warning, the time limit) reaches
# every process directly: the shell keeps waiting so that the trainers can save within the
# cluster's KillWait, and does not requeue (SLURM requeues preempted jobs itself).

# shellcheck source=common.sh
source "$AOGPT_REPO/slurm/lib/common.sh"

aogpt_train() {
    aogpt_require_job
    aogpt_setup

    local gpus procs
    gpus=$(aogpt_gpus_per_node 8) || exit 2
    procs=$(aogpt_procs_per_node "$gpus") || exit 2
    if [ "$gpus" = 0 ]; then
        AOGPT_DS_CONFIG=${AOGPT_DS_CONFIG:-ds_configs/cpu.json}
    else
        AOGPT_DS_CONFIG=${AOGPT_DS_CONFIG:-$AOGPT_DEFAULT_DS_CONFIG}
    fi
    aogpt_require_path AOGPT_CONFIG "${AOGPT_CONFIG:-}"
    aogpt_require_path AOGPT_DS_CONFIG "$AOGPT_DS_CONFIG"
    [ -f trainer/main.py ] || aogpt_die "$AOGPT_REPO has no trainer/main.py: set AOGPT_REPO to the checkout"
    [ -n "${SLURM_JOB_NODELIST:-}" ] || aogpt_die "SLURM_JOB_NODELIST is not set"

    local nodes
    mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
    [ "${#nodes[@]}" -gt 0 ] || aogpt_die "scontrol could not expand SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST"
    local nnodes=${#nodes[@]}
    # torchrun on the first node hosts the rendezvous. The batch shell runs there, and that
    # machine's own hostname is what other nodes resolve (a SLURM node name need not be one).
    local master_addr=${nodes[0]}
    [ "${SLURMD_NODENAME:-}" = "${nodes[0]}" ] && master_addr=$(hostname)
    master_addr=${AOGPT_MASTER_ADDR:-$master_addr}
    local master_port=${AOGPT_MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
    local cpus=${SLURM_CPUS_ON_NODE:-$(nproc)}
    # Seconds torchrun gives its trainers to checkpoint and exit after a signal before it
    # kills them; keep it below the --signal lead time.
    local grace=${AOGPT_SIGNAL_GRACE:-240}

    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cpus / procs > 0 ? cpus / procs : 1))}
    # A failed collective ends the job instead of hanging it until the time limit.
    export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}

    local overrides=()
    [ -n "${AOGPT_DATA:-}" ] && overrides+=("data.path=$AOGPT_DATA")
    [ -n "${AOGPT_OUT_DIR:-}" ] && overrides+=("out_dir=$AOGPT_OUT_DIR")
    if [ -n "${AOGPT_EVAL_DIR:-}" ]; then  # the paper's five zero-shot sets, as the presets name them
        local sets=() name
        for name in wikitext2 wikitext103 ptb lambada lm1b; do sets+=("$AOGPT_EVAL_DIR/$name"); done
        overrides+=("eval.sets=[$(IFS=,; echo "${sets[*]}")]")
    fi
    local extra
    read -r -a extra <<<"${AOGPT_OVERRIDES:-}"
    overrides+=("${extra[@]}")

    # The step gets all of the job's GPUs (srun's default), and each torchrun sees its node's.
    local srun=(srun --nodes="$nnodes" --ntasks-per-node=1 --cpus-per-task="$cpus"
        --kill-on-bad-exit=1)
    # shellcheck disable=SC2054  # the commas belong to --signals-to-handle
    local torchrun=("$AOGPT_PY" -m torch.distributed.run --nnodes="$nnodes"
        --nproc-per-node="$procs" --rdzv-backend=c10d --rdzv-endpoint="$master_addr:$master_port"
        --rdzv-id="aogpt-$SLURM_JOB_ID" --max-restarts=0
        --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 --shutdown-timeout="$grace")
    local trainer=(trainer/main.py --ds_config "$AOGPT_DS_CONFIG" --config "$AOGPT_CONFIG"
        "${overrides[@]}")

    aogpt_log "job ${SLURM_JOB_ID}${SLURM_JOB_NAME:+ ($SLURM_JOB_NAME)}, restart ${SLURM_RESTART_COUNT:-0}, repo $AOGPT_REPO"
    aogpt_log "nodes ($nnodes): ${nodes[*]}"
    aogpt_log "world: $nnodes node(s) x $procs process(es) = $((nnodes * procs)) ranks," \
        "$([ "$gpus" = 0 ] && echo CPU-only || echo "$gpus GPUs per node")," \
        "rendezvous c10d at $master_addr:$master_port"
    aogpt_log "OMP_NUM_THREADS=$OMP_NUM_THREADS TORCH_NCCL_ASYNC_ERROR_HANDLING=$TORCH_NCCL_ASYNC_ERROR_HANDLING" \
        "NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-<unset>} NCCL_DEBUG=${NCCL_DEBUG:-<unset>}"
    aogpt_show "${srun[@]}" "${torchrun[@]}" "${trainer[@]}"
    if [ "${AOGPT_DRY_RUN:-0}" != 0 ]; then
        return 0
    fi
    aogpt_run_step "${srun[@]}" "${torchrun[@]}" "${trainer[@]}"
}

# Runs the srun step in the background so that the shell can take signals while it waits.
aogpt_run_step() {
    local warned=0 step rc=0
    trap 'warned=1; aogpt_log "time-limit warning (SIGUSR1): SIGTERM to the step, the trainers checkpoint";
          scancel --signal=TERM "$SLURM_JOB_ID"' USR1
    trap 'aogpt_log "SIGTERM: SLURM signals the trainers too; waiting for them to checkpoint"' TERM
    "$@" &
    step=$!
    # wait returns early whenever a trapped signal arrives: wait again until the step is over.
    while kill -0 "$step" 2>/dev/null; do
        wait "$step" || true
    done
    wait "$step" || rc=$?
    trap - USR1 TERM
    if [ "$warned" = 1 ] && [ "$rc" != 0 ]; then
        # torchrun reports the signal it passed on with a SignalException traceback above.
        aogpt_log "step ended (exit $rc) after the warning: requeueing job $SLURM_JOB_ID to resume"
        scontrol requeue "$SLURM_JOB_ID" \
            || aogpt_die "scontrol requeue failed: submit the same command again to resume"
        exit 0
    fi
    aogpt_log "step ended with exit status $rc"
    exit "$rc"
}
