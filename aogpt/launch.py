"""DeepSpeed's launcher, with a Ctrl-C that ends in one line once the ranks have saved.

    python -m aogpt.launch [DeepSpeed launcher flags] trainer/main.py [the trainer's arguments]
    python -m aogpt.launch --num_gpus 8 trainer/main.py --ds_config ds_configs/zero2.json \\
        --config configs/ao_gpt_small.yaml

Every argument goes to DeepSpeed's launcher unchanged (`deepspeed` takes the same: --num_gpus,
--include, --master_port, --hostfile, --num_nodes, ...); the exit status is the launcher's.
What differs is a signal. A terminal's Ctrl-C reaches every process of its foreground group:
DeepSpeed's launcher answers it with a KeyboardInterrupt traceback, and its per-node process
stops the ranks with SIGTERM and kills them 30 s later, whether or not they have finished
saving. Here the launcher runs in a session of its own, out of the terminal's reach, and this
process passes a Ctrl-C (or a SIGTERM or SIGHUP) to the ranks alone, as the terminal would have:
they save a checkpoint at the end of their step and stop; a second Ctrl-C stops them at once
without saving (trainer/main.py). Once they have, one line says what became of the run, and the
exit status is 130. A Ctrl-C before any rank has started stops the launcher: there is nothing to
save. Across nodes (--hostfile), the signal goes to the launcher's own multi-node launcher
(pdsh, mpirun, srun), which passes it on its own way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

RUNNER = "deepspeed.launcher.runner"  # what the `deepspeed` command runs
NODE_LAUNCHER = "deepspeed.launcher.launch"  # the per-node process whose children are the ranks
SAVED = 75  # trainer/main.py's status once it has saved a checkpoint and stopped on a signal
INTERRUPTED = 130
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def parse_args(argv: list[str]):
    """DeepSpeed's launcher's own command line (its parser, its checks, its --help)."""
    from deepspeed.launcher import runner

    return runner.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\nDeepSpeed's launcher flags:\n", flush=True)
        parse_args(["--help"])  # prints them and exits
    launcher = subprocess.Popen([sys.executable, "-m", RUNNER, *argv], start_new_session=True)
    received: list[int] = []
    reached: list[bool] = []  # per signal: whether there were ranks to pass it to

    def forward(signum, frame) -> None:
        received.append(signum)
        reached.append(_forward(launcher.pid, signal.SIGTERM if signum == signal.SIGHUP
                                else signum))

    for sig in FORWARDED:
        signal.signal(sig, forward)
    status = launcher.wait()
    if signal.SIGINT not in received:
        return status
    print(_outcome(status, started=any(reached)), file=sys.stderr, flush=True)
    return INTERRUPTED


def _forward(launcher_pid: int, signum: int) -> bool:
    """Passes `signum` to the ranks (the children of each per-node launcher); to a multi-node
    launcher across nodes; before any rank has started, SIGTERM to the whole launcher. Whether
    there were ranks (or a multi-node launcher) to pass it to."""
    import psutil

    try:
        tree = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return False  # it has ended already: its status says how
    node_launchers = [process for process in tree if _runs(process, NODE_LAUNCHER)]
    ranks = [rank for node in node_launchers for rank in _children(node)]
    across_nodes = [] if node_launchers else [child for child in tree
                                              if child.ppid() == launcher_pid]
    for process in ranks or across_nodes:
        try:
            process.send_signal(signum)
        except psutil.NoSuchProcess:
            pass
    if not ranks and not across_nodes:
        try:
            os.killpg(launcher_pid, signal.SIGTERM)  # the session the launcher leads
        except ProcessLookupError:
            pass
    return bool(ranks or across_nodes)


def _runs(process, module: str) -> bool:
    import psutil

    try:
        return module in process.cmdline()
    except psutil.Error:
        return False


def _children(process) -> list:
    import psutil

    try:
        return process.children()
    except psutil.Error:
        return []


def _outcome(status: int, started: bool) -> str:
    if not started:
        return "interrupted: stopped before any rank had started (nothing to save)"
    if status == SAVED:
        return ("interrupted: every rank saved a checkpoint and stopped; the same command "
                "resumes from it")
    return (f"interrupted: the ranks stopped with status {status} (their lines above say "
            f"whether a checkpoint was saved)")


if __name__ == "__main__":
    sys.exit(main())
