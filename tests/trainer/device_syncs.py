"""Counting the places where training waits for its device, on a CPU.

A CPU has no queue to drain, so nothing here is slow; but the code that would wait on a GPU can
be found all the same, by what it calls:

- `get_accelerator().synchronize()` and `torch.cuda.synchronize()`;
- a stream's or an event's synchronize(). DeepSpeed's CPU accelerator says that it "resolves
  data dependencies" and skips its stream waits; `CudaLikeAccelerator` answers as CUDA does
  (streams and events that record their waits), so those code paths run and are counted;
- reading a tensor on the host: `.item()`, `bool()`, `float()` (all `aten._local_scalar_dense`),
  `.tolist()`, `.numpy()`, `.cpu()`;
- making a tensor from host data, `torch.tensor(x, device=...)` (`aten.lift_fresh`): on a GPU a
  copy from pageable memory that waits for the stream;
- the ops a CUDA device waits in although no host value appears in the code (boolean-mask
  indexing, nonzero, repeat_interleave without output_size..., tests/device_testing.py's
  cuda_sync), which a CPU runs without waiting.

`SyncLog` records each of them with the training step it happened in and the code that called
it (the innermost frames of this repository or of DeepSpeed). tests/trainer/run_counting_syncs.py
installs it in a real training run.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.utils import noop_context
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # run_counting_syncs.py runs as a script
from device_testing import cuda_sync  # noqa: E402

HOST_READS = ("tolist", "numpy", "cpu")


def _ours_or_deepspeeds(filename: str) -> bool:
    if "site-packages" in filename:
        return ("site-packages/deepspeed/" in filename
                or "site-packages/torch/utils/data/" in filename)
    return filename.startswith(str(REPO)) and not filename.endswith("device_syncs.py")


def _caller() -> str:
    """file:line:function of the innermost frames of the repository, DeepSpeed or torch's
    DataLoader, innermost first."""
    frames = [f for f in traceback.extract_stack()[:-3] if _ours_or_deepspeeds(f.filename)]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in frames[-3:][::-1])


@dataclass
class SyncLog:
    step: int = 0  # the optimizer step under way (set by run_counting_syncs.py)
    events: list[dict] = field(default_factory=list)

    def record(self, kind: str) -> None:
        self.events.append({"step": self.step, "kind": kind, "where": _caller()})


class _Reads(TorchDispatchMode):
    """Host reads and tensors made from host data, as they reach the dispatcher."""

    def __init__(self, log: SyncLog):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            self.log.record("item")
        elif func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default):
            self.log.record("tensor from host data")
        elif waits := cuda_sync(func, args, kwargs):
            self.log.record(f"{func.name()}: {waits}")
        return func(*args, **kwargs)


def install(log: SyncLog) -> _Reads:
    """Patches the process (for good: it runs in a process of its own) and returns the dispatch
    mode to enter around the training."""
    accelerator = type(get_accelerator())

    class Event:
        def __init__(self, *args, **kwargs):
            pass

        def record(self, stream=None):
            pass

        def wait(self, stream=None):
            pass

        def query(self):
            return True

        def synchronize(self):
            log.record("event.synchronize")

    class Stream:
        def __init__(self, *args, **kwargs):
            pass

        def wait_stream(self, stream):
            pass

        def wait_event(self, event):
            pass

        def record_event(self, event=None):
            return Event()

        def query(self):
            return True

        def synchronize(self):
            log.record("stream.synchronize")

    the_stream = Stream()
    accelerator.resolves_data_dependency = lambda self: False
    accelerator.is_synchronized_device = lambda self: False
    accelerator.handles_memory_backpressure = lambda self: False
    accelerator.Stream = property(lambda self: Stream)
    accelerator.Event = property(lambda self: Event)
    accelerator.current_stream = lambda self, device_index=None: the_stream
    accelerator.default_stream = lambda self, device_index=None: the_stream
    accelerator.stream = lambda self, stream: noop_context()
    accelerator.synchronize = lambda self, device_index=None: log.record("accelerator.synchronize")
    torch.cuda.synchronize = lambda device=None: log.record("torch.cuda.synchronize")
    record_stream = torch.Tensor.record_stream
    torch.Tensor.record_stream = (
        lambda self, stream: None if isinstance(stream, Stream) else record_stream(self, stream))
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def read(self, *args, _original=original, _name=name, **kwargs):
            log.record(f".{_name}()")
            return _original(self, *args, **kwargs)

        setattr(torch.Tensor, name, read)
    return _Reads(log)
