#!/bin/bash
# OpenWebText (or local text) -> GPT-2 tokens -> MDS shards for training, once, on one CPU node.
#
#   cd aogpt && AOGPT_DATA=data/owt sbatch slurm/data_prep.sh          # OpenWebText from the hub
#   AOGPT_DATA=/scratch/$USER/owt AOGPT_DATA_SOURCE="/datasets/openwebtext/urlsf_subset00.tar" \
#       sbatch --cpus-per-task=64 --partition=cpu slurm/data_prep.sh
#
# One process with --workers = the job's CPUs: owt_to_mds.py tokenizes and writes in parallel
# inside the node, and its output does not depend on the worker count. An interrupted job
# resumes or rebuilds cleanly when submitted again; a complete folder is left as it is.
# Write the output to a filesystem that the training nodes read (uncompressed, the default).
# Logs: logs/<job name>-<job id>.out.
#
# Settings (environment variables; sbatch passes the submitting shell's environment on):
#   AOGPT_DATA         output folder, required (the trainer's data.path, e.g. data/owt)
#   AOGPT_DATA_SOURCE  space-separated sources: a Hugging Face dataset id or local files and
#                      folders (.txt, .jsonl[.gz], .parquet, OpenWebText's .tar/.xz);
#                      default: OpenWebText from the hub
#   AOGPT_SEQ_LEN      tokens per sample (default 1024, the presets' model.block_size)
#   AOGPT_DATA_ARGS    more flags for data_prep/owt_to_mds.py, e.g. "--overwrite"
#   AOGPT_VENV         virtual environment to use (default .venv of the repo, else python3)
#   AOGPT_PYTHON       python executable, instead of AOGPT_VENV
#   AOGPT_REPO         the checkout (default: where sbatch was run)
#   AOGPT_DRY_RUN=1    print the command, start nothing
#   HF_HOME, HF_TOKEN, AOGPT_TOKENIZER_FILE are passed through (compute nodes without internet:
#   fill the HF cache and `make tokenizer` on a login node first).
#
#SBATCH --job-name=aogpt-data
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=16
#SBATCH --mem=32G
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
[ -n "${AOGPT_DATA:-}" ] || aogpt_die "AOGPT_DATA is not set: the output folder, e.g. AOGPT_DATA=data/owt"

read -r -a sources <<<"${AOGPT_DATA_SOURCE:-}"
read -r -a extra <<<"${AOGPT_DATA_ARGS:-}"
command=("$AOGPT_PY" data_prep/owt_to_mds.py --out "$AOGPT_DATA"
    --workers "${SLURM_CPUS_PER_TASK:-$(nproc)}" --seq-len "${AOGPT_SEQ_LEN:-1024}")
[ "${#sources[@]}" = 0 ] || command+=(--source "${sources[@]}")
aogpt_log "job ${SLURM_JOB_ID:-<dry run>} on ${SLURMD_NODENAME:-$(hostname)}"
aogpt_run "${command[@]}" "${extra[@]}"
