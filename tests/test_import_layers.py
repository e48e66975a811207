"""The floors hold, and commands are leaves.

Floors: aogpt/ (floor 1) < model/, data_prep/ (2) < trainer/ (3) < benchmarks/, tools/,
experiments/ (4). A module imports only modules of its own floor or of floors below: an import
that runs back up (aogpt.files importing the run folder's layout from model/, a trainer module
importing a benchmark) is refused, naming both files.

Commands: a command module is a file that runs as a script, one with an `if __name__ ==
"__main__":` block at its top level, or a package's __main__.py (what `python -m PACKAGE` runs).
No module imports one, neither library code nor another command: what two commands share lives
in a library module. Every other module of the repository is library code, the packaged ones
(setup.py's PACKAGES, installed as aogpt.*) and the helpers beside the scripts in tools/,
benchmarks/ and experiments/ alike.

The modules, the commands and the imports are derived from the files (tests/modules_testing.py),
every import counted: at the top, inside functions (lazy imports) and under TYPE_CHECKING.
"""

from __future__ import annotations

from pathlib import Path

from conftest import REPO
from modules_testing import imported, is_command, modules

FLOORS = {"aogpt": 1, "model": 2, "data_prep": 2, "trainer": 3,
          "benchmarks": 4, "tools": 4, "experiments": 4}


def floor_problems(root: Path) -> list[str]:
    """One line per import that runs up to a higher floor, and per module on no floor."""
    known = modules(root)
    problems = []
    for name, path in known.items():
        folder = path.relative_to(root).parts[0]
        if folder not in FLOORS:
            problems.append(f"{path.relative_to(root)} is on no floor: give {folder}/ one in "
                            "tests/test_import_layers.py's FLOORS")
            continue
        for line, target in imported(name, path, known):
            above = known[target].relative_to(root).parts[0]
            if FLOORS.get(above, 0) > FLOORS[folder]:
                problems.append(
                    f"{path.relative_to(root)}:{line} imports {known[target].relative_to(root)}: "
                    f"{folder}/ (floor {FLOORS[folder]}) stands below {above}/ (floor "
                    f"{FLOORS[above]}): what it needs belongs on floor {FLOORS[folder]} or below")
    return problems


def imports_of_commands(root: Path) -> list[str]:
    """One line per import of a command module, naming both files."""
    known = modules(root)
    commands = {name for name, path in known.items() if is_command(path)}
    problems = []
    for name, path in known.items():
        kind = "a command" if name in commands else "library code"
        for line, target in imported(name, path, known):
            if target in commands:
                problems.append(f"{path.relative_to(root)}:{line} ({kind}) imports "
                                f"{known[target].relative_to(root)}, a command: move what it "
                                "needs into a library module")
    return problems


def test_no_import_runs_back_up_a_floor():
    assert floor_problems(REPO) == []


def test_no_module_imports_a_command_module():
    assert imports_of_commands(REPO) == []


def test_the_rules_see_commands_library_code_and_floors_as_the_repository_has_them():
    """The sets the rules check are the real ones: the commands the README runs are commands,
    the modules every command builds on are library code, each has imports to check, and every
    folder of modules stands on a floor."""
    known = modules(REPO)
    commands = {name for name, path in known.items() if is_command(path)}
    assert {"aogpt.trainer.main", "aogpt.trainer.evaluate", "aogpt.trainer.sample",
            "aogpt.trainer.genppl", "aogpt.data_prep.owt_to_mds", "tools:export_hf",
            "benchmarks:eval_ensemble", "experiments:run"} <= commands
    assert {"aogpt.trainer.training_samples", "aogpt.trainer.judge", "aogpt.trainer.evaluation",
            "aogpt.model.sampler.outputs", "aogpt.run_folder", "benchmarks:results",
            "experiments:report"}.isdisjoint(commands)
    lines = imported("aogpt.trainer.training_samples", known["aogpt.trainer.training_samples"],
                     known)
    assert {"aogpt.trainer.judge", "aogpt.model.sampler"} <= {target for _, target in lines}
    assert {path.relative_to(REPO).parts[0] for path in known.values()} == set(FLOORS)


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


FLOORED_PACKAGES = ('PACKAGES = {"aogpt": "aogpt", "aogpt.model": "model", '
                    '"aogpt.data_prep": "data_prep", "aogpt.trainer": "trainer"}\n')


def test_an_import_up_a_floor_is_named(tmp_path):
    """The check fails, naming the file, the line and both floors, for each way an import can
    run back up: the ground floor importing a layout from model/ (as aogpt/files.py did), lazily
    in a function, a package importing a module of a higher package, a script's neighbour; and
    lets the arrows that run down or stay on their floor be."""
    write_tree(tmp_path, {
        "setup.py": FLOORED_PACKAGES,
        **{f"{folder}/__init__.py": "" for folder in ("aogpt", "model", "data_prep", "trainer")},
        "aogpt/files.py": "from aogpt.model.run_folder import RunFolder\n",
        "aogpt/lazy.py": "def f():\n    from aogpt.data_prep import manifest\n    return 1\n",
        "model/run_folder.py": "from aogpt import files\n",
        "model/gpt.py": "import aogpt.trainer.loop\nfrom aogpt.model import run_folder\n",
        "data_prep/manifest.py": "from aogpt.trainer import loop\n",
        "trainer/loop.py": "from aogpt.model import gpt\nfrom aogpt.data_prep import manifest\n",
        "benchmarks/results.py": "X = 1\n",
        "benchmarks/bench.py": "from results import X\nfrom aogpt.trainer.loop import Y\n",
    })
    floors = {"aogpt": 1, "model": 2, "data_prep": 2, "trainer": 3}
    assert floor_problems(tmp_path) == [
        f"{importer}:{line} imports {target}: {below}/ (floor {floors[below]}) stands below "
        f"{above}/ (floor {floors[above]}): what it needs belongs on floor {floors[below]} or below"
        for importer, line, target, below, above in (
            ("aogpt/files.py", 1, "model/run_folder.py", "aogpt", "model"),
            ("aogpt/lazy.py", 2, "data_prep/manifest.py", "aogpt", "data_prep"),
            ("model/gpt.py", 1, "trainer/loop.py", "model", "trainer"),
            ("data_prep/manifest.py", 1, "trainer/loop.py", "data_prep", "trainer"))]


def test_a_module_on_no_floor_is_named(tmp_path):
    write_tree(tmp_path, {"setup.py": 'PACKAGES = {"aogpt": "aogpt", "aogpt.web": "web"}\n',
                          "aogpt/__init__.py": "", "web/__init__.py": "", "web/page.py": ""})
    assert floor_problems(tmp_path) == [
        f"web/{name}.py is on no floor: give web/ one in tests/test_import_layers.py's FLOORS"
        for name in ("__init__", "page")]


def test_an_import_of_a_command_is_named(tmp_path):
    """The check fails, naming the file, the line and the command, for each way of importing
    one: from a package, from the module, plain, lazily in a function, and a script's
    neighbour by its bare name, by library code or by another command."""
    main = ('import sys\n\n\ndef main():\n    return 0\n\n\n'
            'if __name__ == "__main__":\n    sys.exit(main())\n')
    write_tree(tmp_path, {
        "setup.py": 'PACKAGES = {"aogpt.lib": "lib"}\n',
        "lib/__init__.py": "",
        "lib/cmd.py": main,
        "lib/fine.py": "from aogpt.lib import other\n",
        "lib/other.py": "X = 1\n",
        "lib/a.py": "from aogpt.lib import cmd\n",
        "lib/b.py": "from aogpt.lib.cmd import main\n",
        "lib/c.py": "import aogpt.lib.cmd\n",
        "lib/d.py": "def f():\n    from .cmd import main\n    return main\n",
        "benchmarks/bench.py": main,
        "benchmarks/helper.py": "\n\nfrom bench import main\n",
        "benchmarks/other_bench.py": "from bench import main\n" + main,
    })
    problems = imports_of_commands(tmp_path)
    assert problems == [
        f"lib/{name}.py:{line} (library code) imports lib/cmd.py, a command: move what it needs "
        "into a library module" for name, line in (("a", 1), ("b", 1), ("c", 1), ("d", 2))
    ] + [f"benchmarks/{name}.py:{line} ({kind}) imports benchmarks/bench.py, a command: move "
         "what it needs into a library module"
         for name, line, kind in (("helper", 3, "library code"), ("other_bench", 1, "a command"))]
