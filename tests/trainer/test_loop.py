"""The loop's shape: Trainer.fit only asks its components, Trainer.__init__ builds them in one
screen, and the checkpoint folder has one writer (the Checkpointer: `latest` written and tags
removed in trainer/checkpoint.py only)."""

import ast
import inspect
import subprocess

from aogpt.trainer.loop import Trainer

FIT_MAX_LINES = 45  # issue 36: the loop asks, its components do the work
INIT_MAX_LINES = 40  # issue 54: each component built whole, in one screen

# Calls that write, move, link or remove a path: a `latest` file or a tag folder changes only
# through one of them.
PATH_CHANGES = {"write_text", "write_bytes", "write_text_atomic", "write_json_atomic",
                "write_atomic", "open", "rename", "replace", "replace_folder", "symlink_to",
                "hardlink_to", "symlink", "link", "move", "copy", "copy2", "copyfile",
                "copytree", "rmtree", "unlink", "remove", "rmdir"}


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _names(node: ast.AST) -> set[str]:
    """Every name, attribute and string constant within `node`, lower-cased."""
    found = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name):
            found.add(inner.id.lower())
        elif isinstance(inner, ast.Attribute):
            found.add(inner.attr.lower())
        elif isinstance(inner, ast.Constant) and isinstance(inner.value, str):
            found.add(inner.value.lower())
    return found


def checkpoint_folder_changes(source: str) -> list[int]:
    """The lines of `source` that write, move or link a `latest` file (a name, attribute or string
    `latest`, `LATEST`, `latest_file`...) or remove, move or replace a tag folder (tag_dir)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _called_name(node) in PATH_CHANGES:
            names = _names(node)
            if any("latest" in name and "latest_tag" not in name for name in names) or (
                    "tag_dir" in names and _called_name(node) != "open"):
                lines.append(node.lineno)
    return lines


def test_fit_is_a_loop_that_only_asks():
    lines = inspect.getsource(Trainer.fit).splitlines()
    assert len(lines) <= FIT_MAX_LINES, f"Trainer.fit is {len(lines)} lines"


def test_construction_builds_each_component_in_one_screen():
    lines = inspect.getsource(Trainer.__init__).splitlines()
    assert len(lines) <= INIT_MAX_LINES, f"Trainer.__init__ is {len(lines)} lines"


def test_the_scan_sees_every_way_to_move_latest_or_remove_a_tag():
    """What the two writers of issue 36 did (recovery.py moved `latest` and removed tags), and
    other spellings a new writer could take; reading `latest` is no write."""
    writes = """
write_text_atomic(self.run_folder.latest_file, tag, durable=True)
shutil.rmtree(self.run_folder.tag_dir(later))
(Path(out_dir) / "checkpoints" / "latest").write_text(tag)
os.symlink(tag, checkpoints / LATEST)
os.replace(staged, run.latest_file)
with open(os.path.join(folder, "latest"), "w") as f: pass
"""
    assert checkpoint_folder_changes(writes) == [2, 3, 4, 5, 6, 7]
    reads = """
tag = run.latest_file.read_text().strip()
tag = run.latest_tag()
shutil.rmtree(run.latest_tag() and scratch)
print(f"resumed from {run.tag_dir(tag)}")
"""
    assert checkpoint_folder_changes(reads) == []


def test_only_the_checkpointer_writes_latest_or_removes_tags(repo):
    """Every Python file of the project, committed or new (not what runs wrote, such as
    DeepSpeed's zero_to_fp32.py in a run folder), but its tests (which damage folders on
    purpose)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                             "*.py"], cwd=repo, capture_output=True, text=True, check=True)
    writers = {}
    for name in sorted(set(listed.stdout.split())):
        if not name.startswith("tests/") and (repo / name).is_file():
            if lines := checkpoint_folder_changes((repo / name).read_text()):
                writers[name] = lines
    assert list(writers) == ["trainer/checkpoint.py"], writers
