"""The Python files of an exported folder: the transformers wrapper and the model modules it
imports, copied from this package with their `aogpt.` imports made relative.

transformers' remote-code loader copies a folder's modules into a package of its own and follows
their relative imports (`from .gpt import AOGPT`), so the copies run with torch and transformers
alone: no copy of the model is kept by hand, the export ships the code that trained it.
"""

from __future__ import annotations

import re
from pathlib import Path

import aogpt
from aogpt.model import hf

MODEL_DIR = Path(hf.__file__).resolve().parent.parent  # model/, installed as aogpt.model
ENTRY_MODULES = ("configuration_aogpt", "modeling_aogpt")  # what config.json's auto_map names
ROOT_MODULE = "aogpt_root"  # aogpt/__init__.py (UsageError) goes in as aogpt_root.py
AUTO_MAP = {"AutoConfig": "configuration_aogpt.AOGPTConfig",
            "AutoModelForCausalLM": "modeling_aogpt.AOGPTForCausalLM"}

# `from aogpt.model.gpt import ...`, `from aogpt.model.hf.configuration_aogpt import ...` or a
# package's module, `from aogpt.model.sampler.engine import ...`
_MODEL_IMPORT = re.compile(r"^(\s*)from aogpt\.model\.(?:hf\.)?(\w+(?:\.\w+)?) import",
                           re.MULTILINE)
_ROOT_IMPORT = re.compile(r"^(\s*)from aogpt import", re.MULTILINE)
_ANY_AOGPT_IMPORT = re.compile(r"^\s*(?:from|import) aogpt\b", re.MULTILINE)


def _flat(module: str) -> str:
    """A module's name in the exported folder, which is flat: transformers' loader copies the
    modules of one folder and follows no subpackage, so model/sampler/engine.py goes in as
    sampler_engine.py and model/sampler/__init__.py as sampler.py."""
    return module.replace(".", "_")


def _source(module: str) -> Path:
    if module == ROOT_MODULE:
        return Path(aogpt.__file__)
    parts = module.split(".")
    for path in (MODEL_DIR.joinpath(*parts[:-1], f"{parts[-1]}.py"),
                 MODEL_DIR.joinpath(*parts, "__init__.py"), MODEL_DIR / "hf" / f"{module}.py"):
        if path.is_file():
            return path
    raise RuntimeError(f"aogpt.model.{module} is imported by the exported code but is no file "
                       f"in {MODEL_DIR}")


def relative_source(path: Path) -> tuple[str, list[str]]:
    """The text of `path` with aogpt imports made relative, and the modules it imports (their
    names in the exported folder)."""
    text = path.read_text()
    needs = [module for _, module in _MODEL_IMPORT.findall(text)]
    if _ROOT_IMPORT.search(text):
        needs.append(ROOT_MODULE)
    text = _MODEL_IMPORT.sub(lambda m: f"{m.group(1)}from .{_flat(m.group(2))} import", text)
    text = _ROOT_IMPORT.sub(rf"\1from .{ROOT_MODULE} import", text)
    left = _ANY_AOGPT_IMPORT.search(text)
    if left:  # e.g. aogpt.data_prep: a folder without it could not import this module
        raise RuntimeError(f"{path} imports from outside aogpt.model ({left.group().strip()}...): "
                           "the exported folder cannot carry that")
    return text, needs


def write_remote_code(dest: Path) -> list[str]:
    """Writes the wrapper and every module it needs, transitively, into dest; returns the file
    names."""
    texts: dict[str, str] = {}
    needs: dict[str, list[str]] = {}
    todo = list(ENTRY_MODULES)
    while todo:
        module = todo.pop()
        if module not in texts:
            texts[module], needs[module] = relative_source(_source(module))
            todo += needs[module]
    for entry in ENTRY_MODULES:
        texts[entry] += _name_every_module(entry, needs)
    for module, text in texts.items():
        (dest / f"{_flat(module)}.py").write_text(text)
    return sorted(f"{_flat(module)}.py" for module in texts)


def _name_every_module(entry: str, needs: dict[str, list[str]]) -> str:
    """Import lines for the modules `entry` needs only through others.

    For a local folder, transformers copies into its module cache only the modules that the
    entry file imports itself (it reads lines `from .name import`), not those they import in turn.
    """
    found, todo = set(), list(needs[entry])
    while todo:
        module = todo.pop()
        if module not in found:
            found.add(module)
            todo += needs[module]
    indirect = sorted(found - set(needs[entry]) - {entry})
    if not indirect:
        return ""
    lines = "".join(f"from .{_flat(module)} import __name__ as _\n" for module in indirect)
    return ("\n\n# Added by the export: transformers copies only the modules this file imports "
            "itself.\n" + lines)
