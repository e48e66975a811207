"""Imports MosaicML Streaming where torchvision is missing or built for another torch.

`import streaming` imports its image datasets (`streaming.vision`), and those import torchvision.
aogpt only reads and writes token shards, so torchvision is not installed with it: PyPI's
torchvision is built against PyPI's CUDA torch, and next to a CPU-only torch it fails with
"operator torchvision::nms does not exist". When torchvision cannot be imported, an empty
`streaming.vision` module stands in for the image datasets; its text and multimodal datasets,
which aogpt does not use either, are left out, and transformers is not imported for streaming's
data loader (below): a command starts in 4 s instead of 14.

Two more repairs are made here, for every process that imports streaming through this module:
shared-memory blocks that a dataset only attaches to are closed when no longer used
(_AttachedSharedMemory), and a dataset registers its shared memory without breaking another run's
on the same host (aogpt/data_prep/shared_memory/).

Import streaming through this module (`from aogpt.data_prep.streaming_compat import streaming`).
"""

import atexit
import collections
import importlib
import sys
import types


def _torchvision_works() -> bool:
    try:
        importlib.import_module("torchvision")
    except (ImportError, RuntimeError):  # RuntimeError: compiled against a different torch
        return False
    return True


# streaming.base.dataloader imports transformers for one check, isinstance(batch, (dict,
# BatchEncoding, BatchFeature)), and streaming.text imports its AutoTokenizer: 7 of the 11 seconds
# that a command needed to start (transformers pulls in sklearn and torch.distributed.tensor).
# Both classes are collections.UserDict subclasses, so UserDict stands in for them while
# streaming imports: the check still accepts them, and an `import transformers` after this one
# loads the real modules.
_TRANSFORMERS_CLASSES = {"transformers.feature_extraction_utils": "BatchFeature",
                         "transformers.tokenization_utils_base": "BatchEncoding"}


def _stand_in(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name, "aogpt.data_prep.streaming_compat's stand-in")
    module.__dict__.update(attributes)
    return module


def _import_streaming() -> None:
    if "streaming" in sys.modules:
        return
    stand_ins = {"streaming.text": _stand_in("streaming.text"),  # text datasets: not ours
                 "streaming.multimodal": _stand_in("streaming.multimodal")}
    if not _torchvision_works():
        stand_ins["streaming.vision"] = _stand_in("streaming.vision")
    transient = []  # removed again once streaming holds them
    if "transformers" not in sys.modules:
        transient = list(_TRANSFORMERS_CLASSES)
        stand_ins.update({name: _stand_in(name, **{cls: collections.UserDict})
                          for name, cls in _TRANSFORMERS_CLASSES.items()})
    sys.modules.update(stand_ins)
    try:
        importlib.import_module("streaming")
    finally:
        for name in transient:
            del sys.modules[name]


_import_streaming()

import streaming  # noqa: E402
import streaming.base.dataset  # noqa: E402
import streaming.base.shared.prefix  # noqa: E402

from aogpt.data_prep.shared_memory import registration  # noqa: E402


class _AttachedSharedMemory(streaming.base.shared.SharedMemory):
    """Streaming's SharedMemory, without an exit handler for blocks it only attaches to.

    A new dataset finds its shared-memory prefix by attaching to every streaming block still named
    in /dev/shm (those of live datasets, and those a killed process left behind), and streaming
    registers an exit handler for each, which keeps the block and its two file descriptors open
    until the process ends. A process that opens datasets while many such blocks exist runs out
    of file descriptors ("Too many open files"). An attached block is only closed by that handler,
    never unlinked, so closing it when it is no longer referenced changes nothing else."""

    def __init__(self, name=None, create=None, size: int = 0, auto_cleanup: bool = True):
        super().__init__(name, create, size, auto_cleanup=auto_cleanup and create is not False)


streaming.base.shared.prefix.SharedMemory = _AttachedSharedMemory

_get_shm_prefix = streaming.base.dataset.get_shm_prefix


def _get_shm_prefix_registered(streams_local, streams_remote, world, retry: int = 100):
    """Streaming's get_shm_prefix, one dataset at a time on a host and after the blocks of runs
    that are gone are removed: see aogpt/data_prep/shared_memory/."""
    with registration(world.is_local_leader):
        return _get_shm_prefix(streams_local, streams_remote, world, retry)


streaming.base.dataset.get_shm_prefix = _get_shm_prefix_registered

__all__ = ["release_shared_memory", "streaming"]


def release_shared_memory(dataset: streaming.StreamingDataset) -> None:
    """Closes (and, where this process made them, unlinks) a dataset's shared-memory blocks now.

    Streaming registers an exit handler for every block it creates or attaches to, so each block
    keeps two file descriptors (the segment and its mapping) open until the process ends, and its
    names stay in /dev/shm for every later dataset to probe. A process that opens datasets one
    after another (a test session, an evaluation over many sets) would run out of file
    descriptors ("Too many open files"). Call this once the dataset and its loaders are done."""
    for block in _shared_blocks(vars(dataset).values()):
        atexit.unregister(block.cleanup)
        block.cleanup()


def _shared_blocks(values, depth: int = 0):
    """The streaming SharedMemory objects among `values`, looking inside streaming's shared
    arrays, scalars and barriers (which hold them)."""
    shared = streaming.base.shared
    for value in values:
        if isinstance(value, shared.SharedMemory):
            yield value
        elif depth < 2 and type(value).__module__.startswith(shared.__name__):
            yield from _shared_blocks(vars(value).values(), depth + 1)
