"""README.md's commands run as written in a fresh clone, one after another, in the README's order.

A command whose comment says what it needs ("# needs GPUs", "# needs the Hugging Face hub",
"# needs SLURM", "# needs your lines.txt") needs more than a CPU and PyPI and is left out; so
are `make demo` and `make test`, which CI runs itself (make test-all, test_packaging.py's demo),
and the installation by hand, which must be what `make install` does (checked against the
Makefile). The rest are shortened by their own documented flags (SHORTER) and must succeed, the
Python examples too.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SHELL_WORDS = ("python", "deepspeed", "torchrun", "make", "pip", "sbatch")
NEEDS = re.compile(r"#\s*needs\b")
SHORTER = {  # documented flags that make a command quick (argparse: the last value given wins)
    "trainer/main.py": ["train.max_steps=2"],
    "trainer/evaluate.py": ["--max-samples", "2"],
    "trainer/sample.py": ["--num-samples", "1"],
    "experiments/run.py": ["--dry-run"],
}
SCRIPT_FOLDERS = ("configs", "data_prep", "ds_configs", "experiments", "slurm", "tools", "trainer")


def code_blocks(markdown: str) -> list[list[str]]:
    """The indented code blocks of a Markdown text, each a list of its lines (indent removed)."""
    blocks, block, previous = [], None, ""
    for line in markdown.splitlines():
        if line.startswith("    ") and (block is not None or not previous.strip()):
            block = block if block is not None else []
            block.append(line[4:])
        elif block is not None and not line.strip():
            block.append("")
        else:
            if block is not None:
                blocks.append(block)
            block = None
        previous = line
    if block is not None:
        blocks.append(block)
    return [[line for line in "\n".join(b).strip("\n").split("\n")] for b in blocks]


def shell_commands(block: list[str]) -> list[str] | None:
    """The block's commands (a line ending in a backslash continues on the next), or None when it
    is not a shell block."""
    commands, pending = [], ""
    for line in block:
        pending += line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        if pending:
            commands.append(pending)
        pending = ""
    first = [next((word for word in command.split() if not re.fullmatch(r"\w+=\S*", word)), "")
             for command in commands]
    return commands if commands and all(word in SHELL_WORDS for word in first) else None


def readme_steps() -> list[tuple[str, str]]:
    """("shell" | "python", code) for every README example, in order."""
    steps = []
    for block in code_blocks((REPO / "README.md").read_text()):
        if block[0].startswith(("import ", "from ")):
            steps.append(("python", "\n".join(block)))
        elif (commands := shell_commands(block)) is not None:
            steps += [("shell", command) for command in commands]
    return steps


def runnable(command: str) -> bool:
    words = shlex.split(command, comments=True)
    return not NEEDS.search(command) and words[0] not in ("make", "pip") and not (
        words[:3] == ["python", "-m", "venv"])


def shortened(command: str) -> str:
    words = shlex.split(command, comments=True)
    extra = next((flags for script, flags in SHORTER.items() if script in words), None)
    return shlex.join(words + extra) if extra else command


def test_every_command_either_runs_here_or_says_what_it_needs():
    steps = readme_steps()
    commands = [code for kind, code in steps if kind == "shell"]
    assert sum(map(runnable, commands)) >= 15 and any(kind == "python" for kind, _ in steps)
    for command in commands:
        if not runnable(command):
            words = shlex.split(command, comments=True)
            assert NEEDS.search(command) or words[0] in ("make", "pip", "python"), command


def test_the_installation_by_hand_is_what_make_install_does():
    makefile = (REPO / "Makefile").read_text()
    installs = re.findall(r"\$\(PY\) -m pip install -q (.+)", makefile)
    by_hand = [part.strip() for _, code in readme_steps() for part in code.split("&&")
               if part.strip().startswith("pip install")]
    assert [line.removeprefix("pip install ") for line in by_hand] == [
        line for line in installs if line != "--upgrade pip"]
    assert "-m aogpt.data_prep.tokenizer fetch" in makefile
    assert ("shell", "python -m aogpt.data_prep.tokenizer fetch") in readme_steps()


@pytest.mark.slow
def test_the_readme_runs_as_written_in_a_fresh_clone(tmp_path):
    """In a folder holding only the repository's scripts and configs (a fresh clone: no data,
    runs or exports), every runnable command and example, in order."""
    for name in SCRIPT_FOLDERS:
        (tmp_path / name).symlink_to(REPO / name)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    done = []
    for kind, code in readme_steps():
        if kind == "shell" and not runnable(code):
            continue
        argv = (["bash", "-c", shortened(code)] if kind == "shell"
                else [sys.executable, "-c", code])
        result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=900)
        assert result.returncode == 0, (code, result.stdout[-2000:], result.stderr[-3000:])
        assert "Traceback" not in result.stderr, (code, result.stderr[-3000:])
        done.append(code)
    for made in ("data/tiny/manifest.json", "runs/tiny/final/model.safetensors", "eval.json",
                 "samples.jsonl", "genppl.json", "hf/tiny/config.json"):
        assert (tmp_path / made).is_file(), made
    assert len(done) >= 17
