"""Commands read as plans: every command's `main` is at most MAIN_MAX_LINES lines (parse, check,
plan, run, report), the work done by the functions it names. A command is what
tests/test_import_layers.py calls one (tests/modules_testing.py finds them)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO
from modules_testing import is_command, modules, parsed

MAIN_MAX_LINES = 40  # from `def main` to its last line
# Mains their owners are shortening (issue 54): each leaves this set the day it reads as a plan.
NOT_YET_PLANS: set[str] = set()


def main_lengths(root: Path) -> dict[str, int | None]:
    """Every command's main, in lines, by the command's path (None: the command has no main)."""
    lengths = {}
    for path in modules(root).values():
        if is_command(path):
            mains = [node for node in parsed(path).body
                     if isinstance(node, ast.FunctionDef) and node.name == "main"]
            lengths[str(path.relative_to(root))] = (mains[0].end_lineno - mains[0].lineno + 1
                                                    if mains else None)
    return lengths


def long_mains(root: Path, exceptions: set[str] = frozenset()) -> dict[str, int | None]:
    return {path: lines for path, lines in main_lengths(root).items()
            if path not in exceptions and (lines is None or lines > MAIN_MAX_LINES)}


def test_every_commands_main_reads_as_a_plan():
    assert long_mains(REPO, NOT_YET_PLANS) == {}


def test_a_command_whose_main_became_a_plan_leaves_the_exceptions():
    assert {path for path, lines in long_mains(REPO).items() if path in NOT_YET_PLANS} \
        == NOT_YET_PLANS


def test_a_long_main_and_a_command_without_one_are_named(tmp_path):
    (tmp_path / "setup.py").write_text('PACKAGES = {"aogpt.lib": "lib"}\n')
    (tmp_path / "lib").mkdir()
    run = 'if __name__ == "__main__":\n    main()\n'
    body = "".join(f"    x{i} = {i}\n" for i in range(MAIN_MAX_LINES - 1))
    (tmp_path / "lib" / "short.py").write_text(f"def main():\n{body}\n\n{run}")
    (tmp_path / "lib" / "long.py").write_text(f"def main():\n{body}    x = 0\n\n\n{run}")
    (tmp_path / "lib" / "bare.py").write_text(run.replace("main()", "print(1)"))
    (tmp_path / "lib" / "library.py").write_text(f"def main():\n{body * 2}")
    assert long_mains(tmp_path) == {"lib/bare.py": None, "lib/long.py": MAIN_MAX_LINES + 1}
