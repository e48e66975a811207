# shellcheck shell=bash
# Shared by every sbatch template in slurm/: where the repository and the python are, how a
# template says what is wrong, and how it shows the command it runs. Sourced, never executed.
#
# sbatch copies a job script into SLURM's spool folder, so "$0" says nothing about where the
# checkout is: the templates take it from AOGPT_REPO, else the folder sbatch was called from
# (SLURM_SUBMIT_DIR), and run everything from there so that relative paths (configs/, data/,
# runs/) mean the same as on the login node.

aogpt_die() {
    echo "error: $*" >&2
    exit 2
}

aogpt_log() {
    echo "[aogpt $(date +%H:%M:%S)] $*"
}

# Prints a command so that it can be pasted back into a shell (quotes only where needed).
aogpt_show() {
    local arg out=""
    for arg in "$@"; do
        if [[ $arg =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then
            out+=" $arg"
        else
            out+=" $(printf %q "$arg")"
        fi
    done
    aogpt_log "command:$out"
}

# A path given relative to the repository, or absolute: it must exist.
aogpt_require_path() {
    local name=$1 path=$2
    [ -n "$path" ] || aogpt_die "$name is not set (see the settings at the top of the template)"
    [ -e "$path" ] || aogpt_die "$name=$path does not exist (relative paths start at $AOGPT_REPO)"
}

# The repository (and cd into it), the python to use, and a sanity check of both.
aogpt_setup() {
    cd "$AOGPT_REPO" || aogpt_die "cannot enter AOGPT_REPO=$AOGPT_REPO"
    if [ -n "${AOGPT_PYTHON:-}" ]; then
        AOGPT_PY=$AOGPT_PYTHON
    elif [ -n "${AOGPT_VENV:-}" ]; then
        AOGPT_PY=$AOGPT_VENV/bin/python
    elif [ -x .venv/bin/python ]; then
        AOGPT_PY=$PWD/.venv/bin/python
    else
        AOGPT_PY=python3
    fi
    command -v "$AOGPT_PY" >/dev/null \
        || aogpt_die "no python at '$AOGPT_PY': set AOGPT_VENV (a virtual environment) or AOGPT_PYTHON"
    # Logs of rank 0 and tracebacks appear as they happen, not when a buffer fills.
    export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
}

# GPUs per node: AOGPT_GPUS_PER_NODE, else what the job was given ("8", or "h100:8" from a
# typed --gpus-per-node), else $1. "cpu" or 0 means CPU-only.
aogpt_gpus_per_node() {
    local gpus=${AOGPT_GPUS_PER_NODE:-${SLURM_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-$1}}}
    gpus=${gpus##*:}
    [ "$gpus" = cpu ] && gpus=0
    [[ $gpus =~ ^[0-9]+$ ]] || aogpt_die "AOGPT_GPUS_PER_NODE=$gpus: give a number of GPUs, or 0 / cpu"
    echo "$gpus"
}

# Processes per node for $1 GPUs per node: one per GPU, or AOGPT_PROCS_PER_NODE (default 1)
# without GPUs.
aogpt_procs_per_node() {
    local procs=$1
    [ "$1" = 0 ] && procs=${AOGPT_PROCS_PER_NODE:-1}
    [[ $procs =~ ^[1-9][0-9]*$ ]] || aogpt_die "AOGPT_PROCS_PER_NODE=$procs: give a positive number"
    echo "$procs"
}

# Inside a job, or in a dry run that only prints what a job would do.
aogpt_require_job() {
    if [ -z "${SLURM_JOB_ID:-}" ] && [ "${AOGPT_DRY_RUN:-0}" = 0 ]; then
        aogpt_die "not inside a SLURM job: submit it with sbatch (AOGPT_DRY_RUN=1 only prints)"
    fi
}

# Shows a command, then runs it (a dry run only shows it).
aogpt_run() {
    aogpt_show "$@"
    [ "${AOGPT_DRY_RUN:-0}" != 0 ] || "$@"
}
