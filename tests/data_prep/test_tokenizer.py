"""The offline GPT-2 tokenizer: right ids, verified file, one-line errors, no other tokenizer."""

import os

import pytest
from conftest import run_cli

from aogpt import UsageError
from aogpt.data_prep import tokenizer


def test_known_gpt2_ids():
    enc = tokenizer.load_gpt2()
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.encode_ordinary(" the") == [262]
    assert enc.n_vocab == tokenizer.N_VOCAB == 50257
    assert enc.encode("<|endoftext|>", allowed_special="all") == [tokenizer.EOS]


def test_split_pattern_matches_tiktokens_r50k():
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")
    assert tokenizer.GPT2_SPLIT_PATTERN == openai_public.r50k_pat_str


def test_explicit_file_wins_over_environment(tmp_path, monkeypatch):
    good = tokenizer.default_cache_path()
    monkeypatch.setenv(tokenizer.ENV_VAR, str(tmp_path / "missing.tiktoken"))
    assert tokenizer.ranks_file(good) == good
    assert tokenizer.load_gpt2(good).encode_ordinary("Hello world") == [15496, 995]


def test_missing_file_is_a_usage_error_that_says_how_to_fix(tmp_path):
    with pytest.raises(UsageError, match="does not exist.*tokenizer fetch"):
        tokenizer.load_gpt2(tmp_path / "nope.tiktoken")


def test_wrong_hash_is_refused(tmp_path):
    fake = tmp_path / "gpt2.tiktoken"
    fake.write_bytes(tokenizer.default_cache_path().read_bytes()[:-100])
    with pytest.raises(UsageError, match="sha256"):
        tokenizer.load_gpt2(fake)


def test_environment_variable_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv(tokenizer.ENV_VAR, str(tmp_path / "absent"))
    with pytest.raises(UsageError, match=str(tmp_path / "absent")):
        tokenizer.load_gpt2()


def test_without_any_file_and_no_network_the_error_is_one_line(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), TIKTOKEN_CACHE_DIR=str(tmp_path / "tk"),
               HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")
    env.pop(tokenizer.ENV_VAR, None)
    result = run_cli("-m", "aogpt.data_prep.tokenizer", "check", env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "tokenizer fetch" in lines[0], result.stderr


def test_check_command_reports_the_source():
    result = run_cli("-m", "aogpt.data_prep.tokenizer", "check",
                     "--tokenizer-file", str(tokenizer.default_cache_path()))
    assert result.returncode == 0
    assert "50257 tokens" in result.stdout and "gpt2.tiktoken" in result.stdout


def test_fetch_is_idempotent():
    result = run_cli("-m", "aogpt.data_prep.tokenizer", "fetch")
    assert result.returncode == 0 and "already present" in result.stdout
