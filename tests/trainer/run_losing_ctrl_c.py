"""A command of this checkout whose start-up loses a KeyboardInterrupt, as C code that calls back
into Python and clears whatever error it meets can while torch loads: test_run_failures.py sends
it Ctrl-C once it says `ready`. Ctrl-C must still end it, with one line and status 130."""

import time

import aogpt  # noqa: F401  (as every command's first import: its Ctrl-C handler)

end = time.monotonic() + 60
while time.monotonic() < end:  # a start-up that takes its time, and loses what is raised in it
    try:
        print("ready", flush=True)  # (again after a loss: the test reads the first line only)
        while time.monotonic() < end:
            time.sleep(0.01)
    except BaseException:
        pass
print("went on after Ctrl-C", flush=True)
