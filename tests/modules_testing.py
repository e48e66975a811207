"""The repository's modules as the structure tests read them (tests/test_import_layers.py,
tests/test_command_mains.py): by the name each is imported under, which of them are commands,
and the repository modules each imports. Derived from the files with ast, never listed by hand,
so a new module or command is covered the day it is added; nothing is imported or run."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

SCRIPT_FOLDERS = ("tools", "benchmarks", "experiments")  # scripts import their neighbours by name


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def packages(root: Path) -> dict[str, str]:
    """setup.py's PACKAGES: package name -> its folder, relative to the repository root."""
    tree = ast.parse((root / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "PACKAGES":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py defines no PACKAGES mapping")


def modules(root: Path) -> dict[str, Path]:
    """Every module of the repository by the name it is imported under: aogpt.trainer.sample for
    trainer/sample.py, results for benchmarks/results.py (a script folder's own name space is
    prefixed with the folder: benchmarks:results)."""
    found = {}
    for package, folder in packages(root).items():
        for path in sorted((root / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    for folder in SCRIPT_FOLDERS:
        for path in sorted((root / folder).glob("*.py")):
            found[f"{folder}:{path.stem}"] = path
    return found


def is_command(path: Path) -> bool:
    """Runs as a script: a top-level `if __name__ == "__main__":`, or a package's __main__.py."""
    if path.name == "__main__.py":
        return True
    for node in parsed(path).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            sides = [node.test.left, *node.test.comparators]
            names = {side.id for side in sides if isinstance(side, ast.Name)}
            values = {side.value for side in sides if isinstance(side, ast.Constant)}
            if names == {"__name__"} and values == {"__main__"}:
                return True
    return False


def imported(name: str, path: Path, known: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, module) of every import of a repository module in `path` (module `name`): at the
    top, inside functions (lazy imports) and under TYPE_CHECKING alike."""
    folder = name.split(":")[0] if ":" in name else None
    package = name if path.stem == "__init__" else name.rpartition(".")[0]

    def resolve(module: str) -> str | None:
        if folder is not None and f"{folder}:{module}" in known:
            return f"{folder}:{module}"  # a script's neighbour, imported by its bare name
        return module if module in known else None

    found = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importer's package
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            # `from aogpt.trainer import sample` imports the module aogpt.trainer.sample
            targets = [f"{base}.{alias.name}" if resolve(f"{base}.{alias.name}") else base
                       for alias in node.names]
        else:
            continue
        found += sorted({(node.lineno, resolve(target)) for target in targets if resolve(target)})
    return found
