"""Bad input to `trainer/main.py`: one clear line on stderr and exit status 2, before any process
group, model or loader exists (so these run in-process as rank 0 of a 2-process world)."""

import json
import os
import shutil
import socket

import pytest
from eval_testing import build_wikitext
from trainer_testing import REPO, SEQ_LEN, TINY_RUN

from aogpt.model.orders import KINDS
from aogpt.trainer import main as main_module
from aogpt.trainer.config import load_config
from aogpt.trainer.main import main
from aogpt.trainer.preflight import unused_settings
from aogpt.trainer.run_lock import RunLock


@pytest.fixture(autouse=True)
def rank0_of_two(monkeypatch):
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(REPO)


def run(data, tmp_path, *overrides, ds_config="ds_configs/cpu.json") -> list[str]:
    return ["--ds_config", str(ds_config), "--config", "configs/tiny.yaml", f"data.path={data}",
            f"out_dir={tmp_path / 'run'}", *TINY_RUN, *overrides]


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


def assert_refused(args, capsys, tmp_path, message: str) -> None:
    assert main(args) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "run").exists()  # nothing written


def test_ds_config_disagreeing_with_the_yaml(text_data, tmp_path, capsys):
    ds_config = tmp_path / "disagrees.json"
    ds_config.write_text(json.dumps({"gradient_accumulation_steps": 4,
                                     "zero_optimization": {"stage": 2}}))
    assert_refused(run(text_data, tmp_path, ds_config=ds_config), capsys, tmp_path,
                   "sets gradient_accumulation_steps=4 but the YAML gives 2")


def test_missing_data_folder(tmp_path, capsys):
    assert_refused(run(tmp_path / "nowhere", tmp_path), capsys, tmp_path,
                   f"data folder {tmp_path / 'nowhere'} does not exist")


def test_data_of_another_sequence_length(text_data, tmp_path, capsys):
    assert_refused(run(text_data, tmp_path, "model.block_size=128", "train.tokens_per_step=4096"),
                   capsys, tmp_path,
                   "the data has samples of 64 tokens, the model's sequence length is 128")


def test_data_of_another_tokenizer(text_data, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(text_data, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["tokenizer"]["ranks_sha256"] = "f" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    assert_refused(run(other, tmp_path), capsys, tmp_path, "the model uses GPT-2")


def test_batch_not_divisible_by_world_size(text_data, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert_refused(run(text_data, tmp_path), capsys, tmp_path,
                   "global batch of 32 sequences is not divisible by micro_batch_size x world "
                   "size = 8 x 3")


def test_unknown_order_kind(text_data, tmp_path, capsys):
    assert_refused(run(text_data, tmp_path, "order.kind=zigzag"), capsys, tmp_path,
                   f"order.kind must be one of {', '.join(KINDS)} (also ")


def test_unknown_config_key(text_data, tmp_path, capsys):
    assert_refused(run(text_data, tmp_path, "train.max_step=3"), capsys, tmp_path,
                   "unknown config key train.max_step (did you mean train.max_steps?)")


def test_other_ranks_exit_2_without_repeating_the_message(text_data, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(main_module, "RANK0_REPORTS_FIRST_S", 0)
    assert main(run(text_data, tmp_path, "order.kind=zigzag")) == 2
    assert capsys.readouterr().err == ""


def test_help_names_the_command_surface(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    usage = capsys.readouterr().out
    assert "--ds_config" in usage and "--config" in usage and "key.sub=value" in usage


# ---- zero-shot sets scored while training (eval.sets) --------------------------------------------


@pytest.fixture(scope="module")
def wikitext_set(tmp_path_factory):
    return build_wikitext(tmp_path_factory.mktemp("eval") / "wikitext2", seq_len=SEQ_LEN)


BUILD = "python data_prep/eval_to_mds.py --dataset NAME --seq-len 64"


def test_a_missing_zero_shot_set(text_data, tmp_path, capsys):
    assert_refused(run(text_data, tmp_path, f"eval.sets=[{tmp_path / 'ptb'}]"), capsys, tmp_path,
                   f"eval.sets: {tmp_path / 'ptb'} does not exist: build it with {BUILD} "
                   f"--out {tmp_path / 'ptb'}")


# What the user named is never the --out of the fix: the command builds into a new folder.
def test_a_zero_shot_set_of_another_sequence_length(text_data, tmp_path, capsys):
    short = build_wikitext(tmp_path / "wikitext2-32", seq_len=32)
    capsys.readouterr()  # what building it printed
    assert_refused(run(text_data, tmp_path, f"eval.sets=[{short}]"), capsys, tmp_path,
                   f"eval.sets: {short} has samples of 32 tokens, the model reads 64 "
                   f"(model.block_size): build the set again with {BUILD} --out "
                   f"{tmp_path / 'wikitext2-32-eval-64'} and list that folder")


def test_a_pretraining_folder_given_as_a_zero_shot_set(text_data, tmp_path, capsys):
    assert_refused(run(text_data, tmp_path, f"eval.sets=[{text_data}]"), capsys, tmp_path,
                   f"eval.sets: {text_data} is a pretrain folder, not an eval set (its val split "
                   f"is scored by eval.batches): build an eval set with {BUILD} --out "
                   f"{text_data.parent / 'text-eval-64'} and list that folder")


def test_a_text_file_given_as_a_zero_shot_set(text_data, tmp_path, capsys):
    source = tmp_path / "ptb.valid.txt"
    source.write_text("the company 's shares rose\n")
    assert_refused(run(text_data, tmp_path, f"eval.sets=[{source}]"), capsys, tmp_path,
                   f"eval.sets: {source} is a file, not an eval set: build one from it with "
                   f"{BUILD} --source {source} --out {tmp_path / 'ptb.valid-eval-64'} and list "
                   "that folder")
    assert source.read_text() == "the company 's shares rose\n"


def test_zero_shot_sets_are_checked_even_when_evaluation_is_off(text_data, tmp_path, capsys):
    assert_refused(run(text_data, tmp_path, f"eval.sets=[{tmp_path / 'ptb'}]", "eval.every=0"),
                   capsys, tmp_path, f"eval.sets: {tmp_path / 'ptb'} does not exist")


def test_a_judge_is_checked_even_when_no_samples_are_drawn(text_data, tmp_path, capsys):
    assert_refused(run(text_data, tmp_path, f"eval.judge={tmp_path / 'gpt2-large'}"), capsys,
                   tmp_path, f"eval.judge: {tmp_path / 'gpt2-large'} is neither a Hugging Face "
                   "GPT-2 folder")


def test_settings_that_another_setting_turns_off_are_warned_about(wikitext_set):
    cfg = load_config(REPO / "configs" / "tiny.yaml", [f"eval.sets=[{wikitext_set}]",
                                                       "eval.every=0", "eval.judge=gpt2-large"])
    assert unused_settings(cfg) == [
        "eval.sets are not scored: eval.every=0 turns evaluation off",
        "eval.judge is not used: eval.sample_every=0 draws no samples to judge"]


def test_an_empty_zero_shot_set(text_data, wikitext_set, tmp_path, capsys):
    empty = tmp_path / "lm1b"
    shutil.copytree(wikitext_set, empty)
    manifest = json.loads((empty / "manifest.json").read_text())
    for split in manifest["splits"].values():  # as eval_to_mds.py writes a set of no samples
        split["samples"] = 0
    (empty / "manifest.json").write_text(json.dumps(manifest))
    assert_refused(run(text_data, tmp_path, f"eval.sets=[{wikitext_set},{empty}]"), capsys,
                   tmp_path, f"eval.sets: {empty} holds no samples")


def test_two_zero_shot_sets_of_one_name(text_data, wikitext_set, tmp_path, capsys):
    other = tmp_path / "other" / "wikitext2"
    shutil.copytree(wikitext_set, other)
    assert_refused(run(text_data, tmp_path, f"eval.sets=[{wikitext_set},{other}]"), capsys,
                   tmp_path, "eval.sets: two folders share a name (wikitext2, wikitext2)")


def test_a_token_budget_below_one_sample(text_data, wikitext_set, tmp_path, capsys):
    assert_refused(run(text_data, tmp_path, f"eval.sets=[{wikitext_set}]", "eval.max_tokens=10"),
                   capsys, tmp_path, "eval.max_tokens must be at least one sample of "
                   "model.block_size = 64 tokens, got 10")


def test_a_judge_that_is_not_a_gpt2(text_data, tmp_path, capsys):
    judge = tmp_path / "bert"
    judge.mkdir()
    (judge / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert_refused(run(text_data, tmp_path, "eval.sample_every=2", "eval.sample_steps=8",
                       f"eval.judge={judge}"), capsys,
                   tmp_path, f"eval.judge: {judge} holds a bert model, not a Hugging Face GPT-2")


def test_samples_of_more_steps_than_tokens(text_data, tmp_path, capsys):
    assert_refused(run(text_data, tmp_path, "eval.sample_every=2", "eval.sample_steps=65"), capsys,
                   tmp_path, "eval.sample_steps must be in 1..64 (model.block_size), got 65")


def test_init_from_a_folder_of_another_vocabulary(text_data, tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000)
                    ).save_pretrained(tmp_path / "gpt2")
    assert_refused(run(text_data, tmp_path, f"model.init_from={tmp_path / 'gpt2'}"), capsys,
                   tmp_path, f"model.init_from: {tmp_path / 'gpt2'} has a vocabulary of 1000 "
                   "tokens, not GPT-2's 50257")


def test_an_out_dir_in_use_by_a_live_training(text_data, tmp_path, capsys):
    """Its lock names a process that is alive on this host (this one, here)."""
    lock = RunLock(tmp_path / "run" / "run.lock")
    lock.acquire()
    try:
        assert main(run(text_data, tmp_path)) == 2
        line = one_error_line(capsys)
    finally:
        lock.release()
    assert line.startswith(f"error: out_dir {tmp_path / 'run'} is in use by another training "
                           f"(process {os.getpid()} on {socket.gethostname()}, started ")
    assert line.endswith(f"): wait for it to end, or choose another out_dir; if that process is "
                         f"gone, delete {tmp_path / 'run' / 'run.lock'}")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == []  # released, nothing else


def test_an_out_dir_that_cannot_be_written(text_data, tmp_path, capsys):
    """/proc refuses new files even to root, whose permission bits allow everything."""
    args = run(text_data, tmp_path)
    args[args.index(f"out_dir={tmp_path / 'run'}")] = "out_dir=/proc/aogpt-run"
    assert main(args) == 2
    assert one_error_line(capsys).startswith(
        "error: out_dir /proc/aogpt-run: cannot write in /proc (")
