#!/bin/bash
# Zero-shot evaluation of a trained model on eval sets made by data_prep/eval_to_mds.py, one GPU.
#
#   cd aogpt && AOGPT_CKPT=runs/ao_gpt_small \
#       AOGPT_EVAL_DATA="data/eval/wikitext2 data/eval/ptb data/eval/lambada" sbatch slurm/eval.sh
#   AOGPT_EVAL_ARGS="--orders l2r,random --num-orders 10 --weights ema" ... sbatch slurm/eval.sh
#   sbatch --gpus-per-node=0 slurm/eval.sh         # on a CPU-only cluster
#
# Runs trainer/evaluate.py once per eval folder and writes one JSON per folder (nll, ppl,
# tokens per order kind). Logs: logs/<job name>-<job id>.out.
#
# Settings (environment variables; sbatch passes the submitting shell's environment on):
#   AOGPT_CKPT        what to evaluate, required: a training out_dir (its final/ weights), a
#                     checkpoint folder, or a consolidated model.pt
#   AOGPT_EVAL_DATA   space-separated eval data folders, required
#   AOGPT_EVAL_ARGS   more flags for trainer/evaluate.py, e.g. "--orders l2r,random --ensemble 4"
#   AOGPT_EVAL_OUT    folder for the JSON results (default logs/eval-<job id>)
#   AOGPT_VENV        virtual environment to use (default .venv of the repo, else python3)
#   AOGPT_PYTHON      python executable, instead of AOGPT_VENV
#   AOGPT_REPO        the checkout (default: where sbatch was run)
#   AOGPT_DRY_RUN=1   print the commands, start nothing
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
[ "${#eval_data[@]}" -gt 0 ] \
    || aogpt_die "AOGPT_EVAL_DATA is not set: eval folders made by data_prep/eval_to_mds.py"
for data in "${eval_data[@]}"; do aogpt_require_path AOGPT_EVAL_DATA "$data"; done
[ "${AOGPT_DRY_RUN:-0}" != 0 ] || [ -f trainer/evaluate.py ] \
    || aogpt_die "$AOGPT_REPO has no trainer/evaluate.py: update the checkout"

read -r -a extra <<<"${AOGPT_EVAL_ARGS:-}"
out=${AOGPT_EVAL_OUT:-logs/eval-${SLURM_JOB_ID:-dry-run}}
[ "${AOGPT_DRY_RUN:-0}" != 0 ] || mkdir -p "$out"
aogpt_log "job ${SLURM_JOB_ID:-<dry run>} on ${SLURMD_NODENAME:-$(hostname)}: $AOGPT_CKPT"
for data in "${eval_data[@]}"; do
    aogpt_run "$AOGPT_PY" trainer/evaluate.py --ckpt "$AOGPT_CKPT" --data "$data" \
        --json "$out/$(basename "$data").json" "${extra[@]}"
done
aogpt_log "results in $out/"
