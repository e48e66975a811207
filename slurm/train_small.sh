#!/bin/bash
# AO-GPT small on a GPU cluster: 2 nodes x 8 GPUs, one trainer process per GPU.
#
#   cd aogpt && sbatch slurm/train_small.sh     # 2 x 8 GPUs, the preset as is
#   sbatch --nodes=4 --partition=gpu --account=me slurm/train_small.sh
#   AOGPT_OVERRIDES="train.max_steps=1000" sbatch --time=2:00:00 slurm/train_small.sh
#   AOGPT_PROCS_PER_NODE=2 sbatch --gpus-per-node=0 slurm/train_small.sh    # a CPU-only cluster
#
# Nodes, GPUs, time, partition and account are sbatch's own flags (they override the lines
# below). Submit from the repository root: sbatch runs a copy of this file from its spool
# folder, so the checkout is found through SLURM_SUBMIT_DIR (or AOGPT_REPO). The job requeues
# itself after a time-limit warning and the requeued job resumes from the last checkpoint;
# re-submitting the same command resumes too. Logs: logs/<job name>-<job id>.out.
#
# Settings (environment variables; sbatch passes the submitting shell's environment on):
#   AOGPT_CONFIG         YAML preset                         (default configs/ao_gpt_small.yaml)
#   AOGPT_DS_CONFIG      DeepSpeed JSON         (default ds_configs/zero2.json; cpu.json on CPU)
#   AOGPT_OVERRIDES      space-separated key=value config overrides, e.g. "train.max_steps=100"
#   AOGPT_DATA           data folder made by data_prep (sets data.path; default: the preset's)
#   AOGPT_OUT_DIR        run folder: checkpoints, metrics (sets out_dir; default: the preset's)
#   AOGPT_EVAL_DIR       folder of the zero-shot sets scored while training, made by
#                        data_prep/eval_to_mds.py: its wikitext2, wikitext103, ptb, lambada and
#                        lm1b (sets eval.sets; default: the preset's, data/eval/...)
#   AOGPT_VENV           virtual environment to use (default .venv of the repo, else python3)
#   AOGPT_PYTHON         python executable, instead of AOGPT_VENV
#   AOGPT_GPUS_PER_NODE  GPUs per node (default: what the job was given, else 8); 0 or cpu on
#                        CPU-only clusters (then also sbatch --gpus-per-node=0)
#   AOGPT_PROCS_PER_NODE processes per node on CPU-only clusters (default 1)
#   AOGPT_MASTER_ADDR    rendezvous address (default: the first node's hostname)
#   AOGPT_MASTER_PORT    rendezvous port (default: 20000 + job id mod 20000)
#   AOGPT_SIGNAL_GRACE   seconds the trainers get to checkpoint after a signal (default 240)
#   AOGPT_REPO           the checkout (default: where sbatch was run)
#   AOGPT_DRY_RUN=1      print the plan and the command, start nothing
#   OMP_NUM_THREADS, NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_DEBUG, ... are passed through
#   (OMP_NUM_THREADS defaults to the node's CPUs / processes per node).
#
#SBATCH --job-name=aogpt-small
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --mem=0
#SBATCH --output=logs/%x-%j.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
set -euo pipefail

AOGPT_CONFIG=${AOGPT_CONFIG:-configs/ao_gpt_small.yaml}
AOGPT_DEFAULT_DS_CONFIG=ds_configs/zero2.json

AOGPT_REPO=${AOGPT_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}
[ -f "$AOGPT_REPO/slurm/lib/launch.sh" ] || {
    echo "error: $AOGPT_REPO is not the aogpt checkout: submit from its root or set AOGPT_REPO" >&2
    exit 2
}
source "$AOGPT_REPO/slurm/lib/launch.sh"
aogpt_train
