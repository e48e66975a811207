"""GPT-2 BPE through tiktoken, with an offline path that never silently changes the tokenizer.

tiktoken downloads GPT-2's ranks at first use, which fails on machines without internet (many
cluster compute nodes). The same ranks (tiktoken's `r50k_base` file, identical to the `gpt2`
encoding) ship inside the `openai-whisper` source distribution on PyPI, so they can be fetched
from a package registry: `python -m aogpt.data_prep.tokenizer fetch`.

Where the ranks come from, first match wins:
1. an explicit path (the `--tokenizer-file` flag of every command),
2. the environment variable AOGPT_TOKENIZER_FILE,
3. the cache written by `fetch` ($XDG_CACHE_HOME/aogpt/gpt2.tiktoken, default ~/.cache/...),
4. tiktoken's own `gpt2` encoding (its cache, or a download).
A file from 1-3 must match the known sha256; anything else is an error, never another tokenizer.
"""

from __future__ import annotations

import binascii
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import tiktoken

from aogpt import UsageError, check_input_file
from aogpt.files import write_bytes_atomic

NAME = "gpt2"
RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
N_VOCAB = 50257
EOS = 50256  # <|endoftext|>, appended after every document
ENV_VAR = "AOGPT_TOKENIZER_FILE"
WHISPER_SDIST = "openai-whisper==20250625"
WHISPER_MEMBER = "whisper/assets/gpt2.tiktoken"

# GPT-2's pre-tokenizer: contractions, letter runs, digit runs, punctuation runs, whitespace.
GPT2_SPLIT_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)

HOW_TO_FIX = (
    f"run `python -m aogpt.data_prep.tokenizer fetch` (gets the ranks from the {WHISPER_SDIST} "
    f"sdist on PyPI), or pass --tokenizer-file / set {ENV_VAR} to a gpt2.tiktoken file"
)


def default_cache_path() -> Path:
    cache_root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache_root / "aogpt" / "gpt2.tiktoken"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_ranks(path: Path) -> dict[bytes, int]:
    check_input_file(path, "tokenizer file", f"GPT-2's ranks file: {HOW_TO_FIX}")
    digest = sha256_of(path)
    if digest != RANKS_SHA256:
        raise UsageError(
            f"tokenizer file {path} has sha256 {digest[:12]}..., "
            f"not GPT-2's {RANKS_SHA256[:12]}...: "
            f"{HOW_TO_FIX}"
        )
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[binascii.a2b_base64(token)] = int(rank)  # base64.b64decode, without its checks
    return ranks


def ranks_file(explicit: str | os.PathLike | None = None) -> Path | None:
    """The local ranks file to use (flag, then environment, then the fetch cache), if any."""
    if explicit:
        return Path(explicit)
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    cached = default_cache_path()
    return cached if cached.is_file() else None


def load_gpt2(tokenizer_file: str | os.PathLike | None = None) -> tiktoken.Encoding:
    """GPT-2's BPE (50257 tokens, EOS 50256) from a verified local file or tiktoken itself."""
    path = ranks_file(tokenizer_file)
    if path is None:
        try:
            return tiktoken.get_encoding(NAME)
        except Exception as err:  # tiktoken raises requests' errors, or ValueError on a bad cache
            raise UsageError(
                f"tiktoken could not load GPT-2's BPE ({type(err).__name__}): {HOW_TO_FIX}"
            ) from None
    return tiktoken.Encoding(
        name=NAME,
        pat_str=GPT2_SPLIT_PATTERN,
        mergeable_ranks=_read_ranks(path),
        special_tokens={"<|endoftext|>": EOS},
        explicit_n_vocab=N_VOCAB,
    )


def describe(encoding: tiktoken.Encoding) -> dict:
    """What a data manifest records about the tokenizer, so readers can refuse a mismatch."""
    return {"name": encoding.name, "n_vocab": encoding.n_vocab, "eos": EOS,
            "ranks_sha256": RANKS_SHA256}


def fetch(dest: Path) -> Path:
    """Downloads the openai-whisper sdist with pip and installs its GPT-2 ranks file at `dest`."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", "-q", "-d", tmp, WHISPER_SDIST]
        result = subprocess.run(cmd, capture_output=True, text=True)
        sdists = (list(Path(tmp).glob("openai_whisper-*.tar.gz"))
                  or list(Path(tmp).glob("openai-whisper-*.tar.gz")))
        if not sdists:
            last_line = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise UsageError(f"pip could not download {WHISPER_SDIST} ({last_line}); "
                             f"copy a gpt2.tiktoken file here by hand and set {ENV_VAR}")
        with tarfile.open(sdists[0]) as archive:
            member = next((m for m in archive.getmembers()
                           if m.name.endswith(WHISPER_MEMBER)), None)
            if member is None:
                raise UsageError(f"{sdists[0].name} has no {WHISPER_MEMBER}; set {ENV_VAR} instead")
            data = archive.extractfile(member).read()
    if hashlib.sha256(data).hexdigest() != RANKS_SHA256:
        raise UsageError(f"the {WHISPER_MEMBER} in {WHISPER_SDIST} does not have GPT-2's sha256")
    return write_bytes_atomic(dest, data)
