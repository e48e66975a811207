"""The data-prep commands at their edges: an impossible --out or a bad number is one line and exit
status 2, before any work, with nothing written."""

from pathlib import Path

import pytest
from conftest import run_cli
from mds_testing import EVAL_TO_MDS, OWT_TO_MDS

from aogpt.data_prep.eval_to_mds import main as eval_to_mds
from aogpt.data_prep.owt_to_mds import main as owt_to_mds

COMMANDS = {"owt_to_mds": [OWT_TO_MDS], "eval_to_mds": [EVAL_TO_MDS, "--dataset", "ptb",
                                                        "--split", "test"]}


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(" the company 's shares rose N N to $ N million .\n" * 50)
    return path


def _out(tmp_path: Path, case: str) -> Path:
    """An --out that cannot be a folder to write in (an existing file, or a file as its parent),
    or that even root cannot write in (a kernel filesystem)."""
    if case in ("/proc", "/sys"):
        if not Path(case).is_dir():
            pytest.skip(f"no {case} here")
        return Path(case) / "aogpt-data"
    (tmp_path / "notes.txt").write_text("precious")
    return tmp_path / "notes.txt" / ("data" if case == "under a file" else "")


@pytest.mark.parametrize("case", ["an existing file", "under a file", "/proc", "/sys"])
@pytest.mark.parametrize("command", COMMANDS)
def test_an_out_that_cannot_be_written_is_one_line_before_any_work(tmp_path, corpus, command,
                                                                   case):
    out = _out(tmp_path, case)
    result = run_cli(*COMMANDS[command], "--source", str(corpus), "--out", str(out))
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()  # no traceback, no progress: nothing was tokenized
    assert line.startswith(f"error: --out {out}: ") and line.endswith(": choose another --out")
    if case in ("/proc", "/sys"):
        assert not out.exists()
    else:
        assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus.txt", "notes.txt"]
        assert (tmp_path / "notes.txt").read_text() == "precious"


BAD_NUMBERS = {
    "owt_to_mds": [("--workers", "0", "--workers must be at least 1, got 0"),
                   ("--workers", "-2", "--workers must be at least 1, got -2"),
                   ("--seq-len", "-5", "--seq-len must be at least 1, got -5"),
                   ("--val-fraction", "1", "--val-fraction must be in [0, 1), got 1.0"),
                   ("--val-fraction", "-0.1", "--val-fraction must be in [0, 1), got -0.1"),
                   ("--val-fraction", "nan", "--val-fraction must be in [0, 1), got nan"),
                   ("--docs-per-chunk", "0", "--docs-per-chunk must be at least 1, got 0"),
                   ("--samples-per-shard", "0", "--samples-per-shard must be between 1 and"),
                   ("--compression", "zstd:99",
                    "--compression 'zstd:99': zstd takes a level from 1 to 22"),
                   ("--compression", "gz:", "--compression 'gz:': gz takes a level from 0 to 9"),
                   ("--compression", "snappy:1",
                    "--compression 'snappy:1': snappy takes no level")],
    "eval_to_mds": [("--workers", "0", "--workers must be at least 1, got 0"),
                    ("--seq-len", "0", "--seq-len must be at least 1, got 0"),
                    ("--seq-len", "-5", "--seq-len must be at least 1, got -5")],
}
MAINS = {"owt_to_mds": (owt_to_mds, []), "eval_to_mds": (eval_to_mds, COMMANDS["eval_to_mds"][1:])}


@pytest.mark.parametrize("command,flag,value,message",
                         [(command, *bad) for command, bads in BAD_NUMBERS.items() for bad in bads])
def test_a_number_out_of_range_is_one_line_and_nothing_is_written(tmp_path, corpus, capsys,
                                                                  command, flag, value, message):
    main, args = MAINS[command]
    out = tmp_path / "out"
    assert main([*args, "--source", str(corpus), "--out", str(out), flag, value]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {message}")
    assert not out.exists()


def test_the_corpora_command_refuses_a_bucket_url_and_makes_no_s3_folder(tmp_path, monkeypatch):
    """It writes local files only: an s3:// --out (which a Path cuts to s3:/) would otherwise be
    made as a local folder named s3:."""
    from aogpt.data_prep.corpora.__main__ import main as corpora

    monkeypatch.chdir(tmp_path)
    assert corpora(["shakespeare", "--out", "s3://bucket/plays"]) == 2
    assert list(tmp_path.iterdir()) == []
