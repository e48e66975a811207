"""Imports MosaicML Streaming where torchvision is missing or built for another torch.

`import streaming` imports its image datasets (`streaming.vision`), and those import torchvision.
aogpt only reads and writes token shards, so torchvision is not installed with it: PyPI's
torchvision is built against PyPI's CUDA torch, and next to a CPU-only torch it fails with
"operator torchvision::nms does not exist". When torchvision cannot be imported, an empty
`streaming.vision` module stands in for the image datasets; nothing else changes.

Import streaming through this module (`from aogpt.data_prep.streaming_compat import streaming`).
"""

import importlib
import sys
import types


def _torchvision_works() -> bool:
    try:
        importlib.import_module("torchvision")
    except (ImportError, RuntimeError):  # RuntimeError: compiled against a different torch
        return False
    return True


if "streaming" not in sys.modules and not _torchvision_works():
    sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")

import streaming  # noqa: E402

__all__ = ["streaming"]
