"""Commands are leaves: no library module imports a command module.

A command module is a file that runs as a script: one with an `if __name__ == "__main__":` block
at its top level, or a package's __main__.py (what `python -m PACKAGE` runs). Every other module
of the repository is library code, the packaged ones (setup.py's PACKAGES, installed as aogpt.*)
and the helpers beside the scripts in tools/, benchmarks/ and experiments/ alike. The sets are
derived from the files, never listed by hand, so a new command or library module is covered the
day it is added. Imports are read with ast, all of them: at the top, inside functions (lazy
imports) and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from conftest import REPO

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
    """(line, module) of every import of a repository module in `path` (module `name`)."""
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


def library_imports_of_commands(root: Path) -> list[str]:
    """One line per import of a command module by library code, naming both files."""
    known = modules(root)
    commands = {name for name, path in known.items() if is_command(path)}
    problems = []
    for name, path in known.items():
        if name in commands:
            continue
        for line, target in imported(name, path, known):
            if target in commands:
                problems.append(f"{path.relative_to(root)}:{line} (library code) imports "
                                f"{known[target].relative_to(root)}, a command: move what it "
                                "needs into a library module")
    return problems


def test_no_library_module_imports_a_command_module():
    assert library_imports_of_commands(REPO) == []


def test_the_rule_sees_commands_and_library_code_as_the_repository_has_them():
    """The sets the rule checks are the real ones: the commands the README runs are commands,
    the modules every command builds on are library code, and each has imports to check."""
    known = modules(REPO)
    commands = {name for name, path in known.items() if is_command(path)}
    assert {"aogpt.trainer.main", "aogpt.trainer.evaluate", "aogpt.trainer.sample",
            "aogpt.trainer.genppl", "aogpt.data_prep.owt_to_mds", "tools:export_hf",
            "benchmarks:eval_ensemble", "experiments:run"} <= commands
    assert {"aogpt.trainer.training_samples", "aogpt.trainer.judge", "aogpt.trainer.evaluation",
            "aogpt.model.sampler.outputs", "aogpt.model.run_folder", "benchmarks:results",
            "experiments:report"}.isdisjoint(commands)
    lines = imported("aogpt.trainer.training_samples", known["aogpt.trainer.training_samples"],
                     known)
    assert {"aogpt.trainer.judge", "aogpt.model.sampler"} <= {target for _, target in lines}


def test_a_library_module_importing_a_command_is_named(tmp_path):
    """The check fails, naming the file, the line and the command, for each way of importing
    one: from a package, from the module, plain, lazily in a function, and a script's
    neighbour by its bare name."""
    (tmp_path / "setup.py").write_text('PACKAGES = {"aogpt.lib": "lib"}\n')
    (tmp_path / "lib").mkdir()
    (tmp_path / "benchmarks").mkdir()
    main = ('import sys\n\n\ndef main():\n    return 0\n\n\n'
            'if __name__ == "__main__":\n    sys.exit(main())\n')
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "cmd.py").write_text(main)
    (tmp_path / "lib" / "fine.py").write_text("from aogpt.lib import other\n")
    (tmp_path / "lib" / "other.py").write_text("X = 1\n")
    (tmp_path / "lib" / "a.py").write_text("from aogpt.lib import cmd\n")
    (tmp_path / "lib" / "b.py").write_text("from aogpt.lib.cmd import main\n")
    (tmp_path / "lib" / "c.py").write_text("import aogpt.lib.cmd\n")
    (tmp_path / "lib" / "d.py").write_text("def f():\n    from .cmd import main\n    return main\n")
    (tmp_path / "benchmarks" / "bench.py").write_text(main)
    (tmp_path / "benchmarks" / "helper.py").write_text("\n\nfrom bench import main\n")
    (tmp_path / "benchmarks" / "other_bench.py").write_text("from bench import main\n" + main)
    problems = library_imports_of_commands(tmp_path)
    assert problems == [
        f"lib/{name}.py:{line} (library code) imports lib/cmd.py, a command: move what it needs "
        "into a library module" for name, line in (("a", 1), ("b", 1), ("c", 1), ("d", 2))
    ] + ["benchmarks/helper.py:3 (library code) imports benchmarks/bench.py, a command: move "
         "what it needs into a library module"]
