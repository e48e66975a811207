#!/bin/bash
# Zero-shot evaluation of a trained model on eval sets made by data_prep/eval_to_mds.py, and
# samples of it, on every GPU of a node.
#
#   cd aogpt && AOGPT_CKPT=runs/ao_gpt_small \
#       AOGPT_EVAL_DATA="data/eval/wikitext2 data/eval/ptb data/eval/lambada" sbatch slurm/eval.sh
#   AOGPT_EVAL_ARGS="--ensemble 1,2,4,8,16,32,64" ... sbatch --gpus-per-node=8 slurm/eval.sh
#   AOGPT_SAMPLE_ARGS="--num-samples 4096 --sampler speculative --out logs/samples.jsonl" \
#       AOGPT_CKPT=runs/ao_gpt_small sbatch --gpus-per-node=8 slurm/eval.sh   # samples only
#   sbatch --gpus-per-node=0 slurm/eval.sh         # on a CPU-only cluster
#
# One node; trainer/evaluate.py runs under torchrun with one process per GPU of the job (each
# scores a slice of the samples), loads the model once and scores every folder (a pretraining
# folder is scored on its val split). It prints a table and writes all results to one JSON.
# With AOGPT_SAMPLE_ARGS, trainer/sample.py then runs on the same processes: each draws its share
# of the batches and the first writes --out, the file one process would write (trainer/ranks.py).
# Logs: logs/<job name>-<job id>.out.
#
# Settings (environment variables; sbatch passes the submitting shell's environment on):
#   AOGPT_CKPT           what to evaluate, required: a training out_dir (its final/ weights),
#                        a checkpoint folder, or a consolidated model.safetensors
#   AOGPT_EVAL_DATA      space-separated data folders to evaluate (required unless
#                        AOGPT_SAMPLE_ARGS is set)
#   AOGPT_EVAL_ARGS      more flags for trainer/evaluate.py, e.g. "--orders l2r,random
#                        --num-orders 10", "--weights raw", "--ensemble 1,2,4,8"
#   AOGPT_SAMPLE_ARGS    flags for trainer/sample.py (--ckpt is AOGPT_CKPT's), e.g. "--num-samples
#                        1024 --order l2r --sampler speculative --out logs/samples.jsonl"
#   AOGPT_EVAL_JSON      where the results go (default logs/eval-<job id>.json)
#   AOGPT_GPUS_PER_NODE  GPUs to use (default: what the job was given, else 1); 0 or cpu: CPU
#   AOGPT_PROCS_PER_NODE processes without GPUs (default 1)
#   AOGPT_VENV           virtual environment to use (default .venv of the repo, else python3)
#   AOGPT_PYTHON         python executable, instead of AOGPT_VENV
#   AOGPT_REPO           the checkout (default: where sbatch was run)
#   AOGPT_DRY_RUN=1      print the command, start nothing
#
#SBATCH --job-name=aogpt-eval
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gpus-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --output=logs/%x-%j.out
set -euo pipefail

AOGPT_REPO=${AOGPT_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}
[ -f "$AOGPT_REPO/slurm/lib/common.sh" ] || {
    echo "error: $AOGPT_REPO is not the aogpt checkout: submit from its root or set AOGPT_REPO" >&2
    exit 2
}
source "$AOGPT_REPO/slurm/lib/common.sh"
aogpt_require_job
aogpt_setup
aogpt_require_path AOGPT_CKPT "${AOGPT_CKPT:-}"
read -r -a eval_data <<<"${AOGPT_EVAL_DATA:-}"
read -r -a sample_args <<<"${AOGPT_SAMPLE_ARGS:-}"
[ "${#eval_data[@]}" -gt 0 ] || [ "${#sample_args[@]}" -gt 0 ] \
    || aogpt_die "AOGPT_EVAL_DATA is not set: data folders made by data_prep/eval_to_mds.py" \
        "(or AOGPT_SAMPLE_ARGS, to sample only)"
data_flags=()
for data in "${eval_data[@]}"; do
    aogpt_require_path AOGPT_EVAL_DATA "$data"
    data_flags+=(--data "$data")
done
[ -f trainer/evaluate.py ] || aogpt_die "$AOGPT_REPO has no trainer/evaluate.py: update the checkout"

gpus=$(aogpt_gpus_per_node 1) || exit 2
procs=$(aogpt_procs_per_node "$gpus") || exit 2
cpus=${SLURM_CPUS_ON_NODE:-$(nproc)}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cpus / procs > 0 ? cpus / procs : 1))}
read -r -a extra <<<"${AOGPT_EVAL_ARGS:-}"
json=${AOGPT_EVAL_JSON:-logs/eval-${SLURM_JOB_ID:-dry-run}.json}
aogpt_log "job ${SLURM_JOB_ID:-<dry run>} on ${SLURMD_NODENAME:-$(hostname)}: $AOGPT_CKPT," \
    "$procs process(es) on $([ "$gpus" = 0 ] && echo CPU || echo "$gpus GPU(s)")"
launch=("$AOGPT_PY" -m torch.distributed.run --standalone --nproc-per-node="$procs")
if [ "${#eval_data[@]}" -gt 0 ]; then
    aogpt_run "${launch[@]}" trainer/evaluate.py --ckpt "$AOGPT_CKPT" "${data_flags[@]}" \
        --json "$json" "${extra[@]}"
fi
if [ "${#sample_args[@]}" -gt 0 ]; then
    aogpt_run "${launch[@]}" trainer/sample.py --ckpt "$AOGPT_CKPT" "${sample_args[@]}"
fi
