#!/bin/bash
# OpenWebText (or local text) -> GPT-2 tokens -> MDS shards for training, once: on one CPU node,
# or as an array of tasks on many nodes.
#
#   cd aogpt && AOGPT_DATA=data/owt sbatch slurm/data_prep.sh          # OpenWebText from the hub
#   AOGPT_DATA=/scratch/$USER/owt AOGPT_DATA_SOURCE="/datasets/openwebtext/urlsf_subset00.tar" \
#       sbatch --cpus-per-task=64 --partition=cpu slurm/data_prep.sh
#   AOGPT_DATA=s3://bucket/owt AOGPT_DATA_SOURCE=... sbatch slurm/data_prep.sh   # into a bucket
#
# One process with --workers = the job's CPUs: owt_to_mds.py tokenizes and writes in parallel
# inside the node, and its output does not depend on the worker count. An interrupted job
# resumes or rebuilds cleanly when submitted again; a complete folder is left as it is.
# Write the output to a filesystem that the training nodes read (uncompressed, the default), or
# to a bucket (s3://, with AOGPT_DATA_STAGING for the local copy it is built in).
#
# Many nodes (a corpus of many files, e.g. a parquet dump), as a job array of N tasks:
#   AOGPT_DATA=/shared/fineweb AOGPT_DATA_SOURCE=/datasets/fineweb/data \
#       sbatch --array=0-7 slurm/data_prep.sh
# Task I tokenizes slice I of N of the input files (owt_to_mds.py --slice I/N) into
# AOGPT_DATA/.slices on the shared filesystem; the array's first task also submits the merge
# (--merge-slices N), a job that starts once every task has succeeded and writes the dataset a
# one-task build writes, byte for byte. A task that failed is submitted again alone, with the
# number of slices, and is followed by a merge of its own:
#   AOGPT_DATA_SLICES=8 AOGPT_DATA=... AOGPT_DATA_SOURCE=... sbatch --array=5 slurm/data_prep.sh
# Logs: logs/<job name>-<job id>.out (a merge's next to its array's, aogpt-data-merge-<id>.out).
#
# Settings (environment variables; sbatch passes the submitting shell's environment on):
#   AOGPT_DATA         output folder, required (the trainer's data.path, e.g. data/owt)
#   AOGPT_DATA_SOURCE  space-separated sources: a Hugging Face dataset id or local files and
#                      folders (.txt, .jsonl[.gz], .parquet, OpenWebText's .tar/.xz);
#                      default: OpenWebText from the hub
#   AOGPT_SEQ_LEN      tokens per sample (default 1024, the presets' model.block_size)
#   AOGPT_DATA_ARGS    more flags for data_prep/owt_to_mds.py, e.g. "--overwrite"
#   AOGPT_DATA_STAGING with an s3:// AOGPT_DATA: the local folder it is built in (--staging);
#                      for an array, a folder on a filesystem that every task sees
#   AOGPT_DATA_SLICES  slices of an array's input (default: the array's number of tasks)
#   AOGPT_DATA_MERGE=N merge the N finished slices (what the merge job the array submits runs)
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
[ -z "${AOGPT_DATA_STAGING:-}" ] || command+=(--staging "$AOGPT_DATA_STAGING")
aogpt_log "job ${SLURM_JOB_ID:-<dry run>} on ${SLURMD_NODENAME:-$(hostname)}"

# The merge job that follows an array: same settings, the same CPUs and memory, its log next to
# the array's, started only once every task has succeeded (cancelled if one fails).
submit_merge() {
    local slices=$1 log_dir=logs flags=()
    log_dir=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | grep -o 'StdOut=[^ ]*') || true
    log_dir=${log_dir#StdOut=}
    log_dir=$(dirname "${log_dir:-logs/job.out}")
    [ -z "${SLURM_CPUS_PER_TASK:-}" ] || flags+=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
    [ -z "${SLURM_MEM_PER_NODE:-}" ] || flags+=(--mem="${SLURM_MEM_PER_NODE}M")
    [ -z "${SLURM_JOB_PARTITION:-}" ] || flags+=(--partition="$SLURM_JOB_PARTITION")
    [ -z "${SLURM_JOB_ACCOUNT:-}" ] || flags+=(--account="$SLURM_JOB_ACCOUNT")
    local submit=(sbatch --parsable --job-name=aogpt-data-merge "${flags[@]}"
        --dependency="afterok:${SLURM_ARRAY_JOB_ID:-0}" --kill-on-invalid-dep=yes
        --output="$log_dir/%x-%j.out" --export="ALL,AOGPT_DATA_MERGE=$slices"
        "$AOGPT_REPO/slurm/data_prep.sh")
    if [ "${AOGPT_DRY_RUN:-0}" != 0 ]; then
        aogpt_show "${submit[@]}"
        return
    fi
    local job
    job=$("${submit[@]}") || aogpt_die "could not submit the merge job: once every task is" \
        "done, submit it with AOGPT_DATA_MERGE=$slices sbatch slurm/data_prep.sh"
    aogpt_log "merge: job $job starts once every task of array job $SLURM_ARRAY_JOB_ID succeeded"
}

if [ -n "${AOGPT_DATA_MERGE:-}" ]; then
    command+=(--merge-slices "$AOGPT_DATA_MERGE")
elif [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
    slices=${AOGPT_DATA_SLICES:-${SLURM_ARRAY_TASK_COUNT:-}}
    [[ $slices =~ ^[1-9][0-9]*$ ]] \
        || aogpt_die "AOGPT_DATA_SLICES=$slices: give the number of slices, a positive number"
    ((SLURM_ARRAY_TASK_ID < slices)) \
        || aogpt_die "array task $SLURM_ARRAY_TASK_ID is past the last of $slices slices:" \
            "submit --array=0-$((slices - 1)), or set AOGPT_DATA_SLICES to the number of slices"
    command+=(--slice "$SLURM_ARRAY_TASK_ID/$slices")
    # the array's first task, once (not again when SLURM requeues it)
    if [ "$SLURM_ARRAY_TASK_ID" = "${SLURM_ARRAY_TASK_MIN:-0}" ] \
        && [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
        submit_merge "$slices"
    fi
fi
aogpt_run "${command[@]}" "${extra[@]}"
