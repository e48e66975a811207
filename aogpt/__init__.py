"""aogpt: distributed pretraining of AO-GPT, the any-order GPT that is a masked diffusion model.

The code lives in the top-level folders model/, data_prep/ and trainer/, installed as
`aogpt.model`, `aogpt.data_prep` and `aogpt.trainer` (see setup.py). This root holds only what
all of them share: the version; the error types that commands print as one line, with cli_entry
that prints them and the checks of a command's input (check_counts, check_input_file);
`aogpt.files`, through which every file is written (complete or absent); the layouts every
floor reads, `aogpt.run_folder` (a training run's out_dir) and `aogpt.data_folder` (how a data
folder is recognised); `aogpt.progress`, how long work shows how far it is; and the CPU
allocator's setting for large tensors. Nothing here imports model/, data_prep/ or trainer/
(tests/test_import_layers.py).
"""

import functools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__version__ = "0.1.0"

# torch's CPU tensors of 2 MB and more on transparent huge pages (its THP_MEM_ALLOC_ENABLE, which
# must be set before torch allocates one), in every process that imports aogpt and the processes
# it starts; a value the user set wins. Each chunk of the loss allocates its logits afresh (chunk x
# 50,257 fp32), faulted in 4 KB at a time without them: benchmarks/cpu_loss.py's loss of 2,048
# tokens took 1,450 ms with huge pages, 1,762 ms without (THP_MEM_ALLOC_ENABLE=0; one thread of
# the project's 2-core AVX2 machine), and a 1-process tiny training 14% less CPU.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


class UsageError(Exception):
    """Bad input from a user (a flag, a config value, a file): the message says what is wrong and
    how to fix it.

    Command-line entry points print it as one line and exit 2 instead of showing a traceback;
    everything else (a bug) still raises with its traceback.
    """


class RunFailure(Exception):
    """A run that cannot go on for a reason outside the code (a corrupt shard, a full disk, a
    non-finite loss): the message names the cause and what is still intact.

    Command-line entry points print it as one line and exit 1.
    """


def check_counts(args: Any, *names: str) -> None:
    """Refuses a count below 1 in the flags `names` (argparse dest names, read from `args`): 0 is
    never a way to ask for the default, which is None (a flag left out)."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def check_unique(values: list | tuple, flag: str, text: str) -> None:
    """Refuses a list flag (`text` as given) that names a value twice: each is run once, and a
    value given twice would be run twice or counted once, neither what was asked."""
    twice = next((value for index, value in enumerate(values) if value in values[:index]), None)
    if twice is not None:
        raise UsageError(f"{flag} {text}: {twice} is given twice (each is run once): give each "
                         f"once")


def comma_counts(text: str, flag: str, minimum: int = 1) -> list[int]:
    """A list flag of counts, "1,8,32": each a whole number >= minimum, none twice; else
    UsageError."""
    try:
        values = [int(value) for value in text.split(",")]
    except ValueError:
        raise UsageError(f"{flag} takes a comma list of whole numbers, got {text!r}") from None
    if min(values) < minimum:
        raise UsageError(f"{flag} values must be >= {minimum}, got {text!r}")
    check_unique(values, flag, text)
    return values


def check_input_file(path: str | os.PathLike, flag: str, expected: str) -> Path:
    """Checks that a file a command reads exists and is a file: a folder or a missing path is
    named as such, with what to give instead (`expected`, e.g. "the paper's ckpt_<iter>.pt
    file"). `flag` names it in the message ("--samples"). Returns the path."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder, not a file: give {expected}")
    if not path.is_file():
        raise UsageError(f"{flag} {path} does not exist: give {expected}")
    return path


def cli_entry(main: Callable[..., int | None]) -> Callable[..., int]:
    """Wraps a command's `main`: a UsageError ends it with one line and exit status 2, a
    RunFailure with one line and exit status 1."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        if signal.getsignal(signal.SIGINT) is _interrupted_before_main:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # main's finally blocks run
        try:
            return main(*args, **kwargs) or 0
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except RunFailure as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return wrapper


def _interrupted_before_main(signum, frame) -> None:
    """Ctrl-C while a command's imports load (torch, deepspeed: seconds), before cli_entry's main
    runs: the same one line and status 130 as cli_entry, at once. Not a KeyboardInterrupt, which
    an import can lose (extension start-up code that calls back into Python and clears whatever
    error it meets): a trainer interrupted so was seen still running 120 s later."""
    os.write(2, b"interrupted\n")  # not print(): the handler may run inside one
    os._exit(130)  # nothing has started that an exit handler would need to end


def _running_a_command() -> bool:
    """Whether the process runs one of this checkout's scripts (trainer/main.py, tools/...), not
    someone's program that imports aogpt, nor the tests."""
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    root = Path(__file__).resolve().parent.parent
    return (script is not None and script.suffix == ".py" and root in script.parents
            and not any(part.startswith(".") for part in script.relative_to(root).parts))


if _running_a_command() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted_before_main)
