#!/usr/bin/env bash
# A real SLURM cluster on this one machine, to try the sbatch templates and to test them.
#
#   slurm/dev/local_cluster.sh install   apt-get install slurm-wlm + munge (Debian/Ubuntu, root)
#   slurm/dev/local_cluster.sh start     write the config, start munged, slurmctld and slurmd(s)
#   slurm/dev/local_cluster.sh stop      stop the daemons this script started
#   slurm/dev/local_cluster.sh status    sinfo of the running cluster
#   eval "$(slurm/dev/local_cluster.sh env)"   point sbatch/srun/squeue of this shell at it
#
# `start` is idempotent: a cluster already answering with this script's config is reused.
# Settings (environment):
#   AOGPT_SLURM_DIR    config, state and logs (default /tmp/aogpt-slurm)
#   AOGPT_SLURM_NODES  virtual nodes, each its own slurmd on this host (default 2)
#   AOGPT_SLURM_CPUS   CPUs each node advertises (default: this machine's count)
#   AOGPT_SLURM_PORT   slurmctld port; node i listens on PORT+i (default 16817, away from 6817
#                      so a site's own SLURM is never disturbed)
#
# The nodes are named aogpt-node1..N and share this host (slurmd -N picks the node; SLURM
# reaches each at 127.0.0.1 on its own port). Each node has its own /dev/shm, as separate
# machines do. Node names do not resolve, but the templates meet at the batch shell's hostname.
# SlurmdParameters=config_overrides lets the nodes advertise the CPUs given here even when,
# together, they exceed the machine's cores; jobs then simply share the cores.
set -euo pipefail

DIR=${AOGPT_SLURM_DIR:-/tmp/aogpt-slurm}
NODES=${AOGPT_SLURM_NODES:-2}
# nproc alone prints OMP_NUM_THREADS where it is set (a test worker's thread share, say)
CPUS=${AOGPT_SLURM_CPUS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
PORT=${AOGPT_SLURM_PORT:-16817}
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF

die() { echo "local_cluster: $*" >&2; exit 1; }

node_names() { for i in $(seq 1 "$NODES"); do echo "aogpt-node$i"; done; }

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
        echo "local_cluster: slurm and munge are installed"
        return
    fi
    [ "$(id -u)" = 0 ] || die "installing needs root (apt-get install slurm-wlm munge)"
    command -v apt-get >/dev/null || die "no apt-get here: install slurm-wlm and munge yourself"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends slurm-wlm munge
}

write_config() {
    mkdir -p "$DIR/state" "$DIR/log" "$DIR/run"
    local memory_mb host
    # The nodes share this machine's memory.
    memory_mb=$(awk -v nodes="$NODES" '/MemTotal/ {print int($2 / 1024 / nodes)}' /proc/meminfo)
    host=$(hostname)
    {
        echo "# Written by slurm/dev/local_cluster.sh: a test cluster on one host."
        echo "ClusterName=aogpt-dev"
        echo "SlurmctldHost=$host(127.0.0.1)"
        echo "SlurmctldPort=$PORT"
        echo "SlurmUser=root"
        echo "AuthType=auth/munge"
        echo "StateSaveLocation=$DIR/state"
        echo "SlurmdSpoolDir=$DIR/spool-%n"
        echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
        echo "SlurmdPidFile=$DIR/run/slurmd-%n.pid"
        echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
        echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU"
        echo "SlurmdParameters=config_overrides"
        echo "JobRequeue=1"
        echo "ReturnToService=2"
        echo "MpiDefault=none"
        echo "SchedulerType=sched/backfill"
        echo "KillWait=30"
        echo "MinJobAge=3600"
        local i=0 name
        for name in $(node_names); do
            i=$((i + 1))
            echo "NodeName=$name NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT + i))" \
                "CPUs=$CPUS RealMemory=$memory_mb State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
    } >"$CONF.tmp"
    mv "$CONF.tmp" "$CONF"
}

start_munge() {
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        return
    fi
    [ -s /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || create-munge-key; }
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge/munge.key 2>/dev/null || true
    if id munge >/dev/null 2>&1; then
        runuser -u munge -- munged
    else
        munged --force
    fi
    for _ in $(seq 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
        sleep 0.1
    done
    die "munged does not answer (see /var/log/munge/munged.log)"
}

# Separate machines have separate shared memory, and programs rely on it: streaming's local
# leader of each node, for one, owns names such as /dev/shm/000000_locals. So each node's slurmd
# (and every job process under it) gets a private /dev/shm in its own mount namespace.
start_slurmd() {
    if unshare --mount --propagation private true 2>/dev/null; then
        # shellcheck disable=SC2016  # $1 is expanded by the inner shell
        unshare --mount --propagation private sh -c \
            'mount -t tmpfs -o size=50% tmpfs /dev/shm && exec slurmd -N "$1"' sh "$1"
    else
        echo "local_cluster: no mount namespaces here: the nodes share /dev/shm" >&2
        slurmd -N "$1"
    fi
}

is_up() { scontrol ping 2>/dev/null | grep -q UP && sinfo -h >/dev/null 2>&1; }

nodes_ready() {
    # All nodes idle or allocated (not down, not still registering).
    local states
    states=$(sinfo -h -N -o '%t' 2>/dev/null) || return 1
    [ "$(echo "$states" | grep -cE '^(idle|alloc|mix|comp)$')" = "$NODES" ]
}

start() {
    [ "$(id -u)" = 0 ] || die "starting a cluster needs root (SlurmUser=root)"
    command -v slurmctld >/dev/null || die "slurm is not installed: run '$0 install' first"
    # reused only as configured now: a cluster left with other CPUs is started afresh
    if [ -f "$CONF" ] && grep -q " CPUs=$CPUS " "$CONF" && is_up && nodes_ready; then
        echo "local_cluster: reusing the running cluster ($CONF)"
        return
    fi
    stop >/dev/null 2>&1 || true
    write_config
    start_munge
    slurmctld -c  # a fresh start forgets the jobs of an earlier one
    local name
    for name in $(node_names); do
        mkdir -p "$DIR/spool-$name"
        start_slurmd "$name"
    done
    for _ in $(seq 150); do
        if is_up && nodes_ready; then
            echo "local_cluster: up, $NODES node(s) x $CPUS CPUs, SLURM_CONF=$CONF"
            return
        fi
        sleep 0.2
    done
    sinfo -N >&2 || true
    tail -n 20 "$DIR/log/slurmctld.log" >&2 || true
    die "the cluster did not come up within 30 s (logs in $DIR/log)"
}

# Stops the daemon $2 whose pid file is $1, if that pid is still that daemon.
stop_pidfile() {
    local pid
    [ -f "$1" ] || return 0
    pid=$(cat "$1")
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]; then
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$1"
}

stop() {
    local name
    for name in $(node_names); do stop_pidfile "$DIR/run/slurmd-$name.pid" slurmd; done
    stop_pidfile "$DIR/run/slurmctld.pid" slurmctld
}

case ${1:-} in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) is_up || die "no cluster answers at $CONF"; sinfo -N ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac
