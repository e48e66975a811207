"""The docs' commands run as written in a fresh clone, one after another: README.md's, then each
page's of docs/README.md's list "Pages whose commands run", in that order.

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
from docs_testing import Block, commands, page, walkthrough

from aogpt.trainer.dist_env import free_port

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


def shell_commands(block: Block) -> list[str] | None:
    """A code block's commands, or None when it is not a shell block (a log, a table)."""
    found = commands(block)
    first = [next((word for word in command.split() if not re.fullmatch(r"\w+=\S*", word)), "")
             for command in found]
    return found if found and all(word in SHELL_WORDS for word in first) else None


def walkthrough_steps() -> list[tuple[str, str]]:
    """("shell" | "python", code) for every example of the pages that run, in order."""
    steps = []
    for path in walkthrough():
        for block in page(path).blocks:
            if block.kind != "code" or not block.lines:
                continue
            if block.lines[0].startswith(("import ", "from ")):
                steps.append(("python", "\n".join(block.lines)))
            elif (found := shell_commands(block)) is not None:
                steps += [("shell", command) for command in found]
    return steps


def runnable(command: str) -> bool:
    words = shlex.split(command, comments=True)
    return not NEEDS.search(command) and words[0] not in ("make", "pip") and not (
        words[:3] == ["python", "-m", "venv"])


def shortened(command: str) -> str:
    """The command with its documented shortening flags, and a launcher on a free port of its
    own (the deepspeed launcher's default, 29500, may be another run's on a shared host)."""
    words = shlex.split(command, comments=True)
    extra = next((flags for script, flags in SHORTER.items() if script in words), None)
    if words[0] == "deepspeed":
        words[1:1] = ["--master_port", str(free_port())]
    elif not extra:
        return command
    return shlex.join(words + (extra or []))


def test_every_command_either_runs_here_or_says_what_it_needs():
    steps = walkthrough_steps()
    commands = [code for kind, code in steps if kind == "shell"]
    assert sum(map(runnable, commands)) >= 15 and any(kind == "python" for kind, _ in steps)
    for command in commands:
        if not runnable(command):
            words = shlex.split(command, comments=True)
            assert NEEDS.search(command) or words[0] in ("make", "pip", "python"), command


def test_the_installation_by_hand_is_what_make_install_does():
    makefile = (REPO / "Makefile").read_text()
    installs = re.findall(r"\$\(PY\) -m pip install -q (.+)", makefile)
    by_hand = [part.strip() for _, code in walkthrough_steps() for part in code.split("&&")
               if part.strip().startswith("pip install")]
    assert [line.removeprefix("pip install ") for line in by_hand] == [
        line for line in installs if line != "--upgrade pip"]
    assert "-m aogpt.data_prep.tokenizer fetch" in makefile
    assert ("shell", "python -m aogpt.data_prep.tokenizer fetch") in walkthrough_steps()


@pytest.mark.slow
def test_the_docs_run_as_written_in_a_fresh_clone(tmp_path):
    """In a folder holding only the repository's scripts and configs (a fresh clone: no data,
    runs or exports), every runnable command and example, in order."""
    for name in SCRIPT_FOLDERS:
        (tmp_path / name).symlink_to(REPO / name)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    done = []
    for kind, code in walkthrough_steps():
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
