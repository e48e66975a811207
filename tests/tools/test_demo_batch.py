"""tools/demo.py picks a batch that the trainer accepts on any number of GPUs."""

import json

import pytest
from conftest import REPO, tool

from aogpt.data_prep.tokenizer import load_gpt2
from aogpt.trainer.config import load_config

demo = tool("demo")


RECIPE = load_config(REPO / demo.CONFIG)


def batch_for(processes: int) -> tuple[int, int]:
    return demo.demo_batch(processes, RECIPE.model.block_size, RECIPE.train.tokens_per_step,
                           RECIPE.train.micro_batch_size)


@pytest.mark.parametrize("processes", range(1, 17))
def test_demo_batch_is_accepted_by_the_trainer_on_any_gpu_count(processes):
    micro_batch, tokens_per_step = batch_for(processes)
    cfg = load_config(REPO / demo.CONFIG, [f"train.micro_batch_size={micro_batch}",
                                           f"train.tokens_per_step={tokens_per_step}"])
    cfg.validate(world_size=processes)  # raises a UsageError for a batch that does not divide
    accumulation = cfg.gradient_accumulation_steps(processes)  # what DeepSpeed is given
    assert cfg.sequences_per_step == micro_batch * processes * accumulation
    assert 1 <= micro_batch <= RECIPE.train.micro_batch_size and 1 <= accumulation <= 4
    assert abs(tokens_per_step - 4096) <= 4096 // 5  # close to the recipe's batch


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_demo_keeps_the_recipes_batch_where_it_divides(processes):
    assert batch_for(processes) == (RECIPE.train.micro_batch_size, RECIPE.train.tokens_per_step)


def test_demo_batch_on_eight_gpus_keeps_4096_tokens_with_smaller_micro_batches():
    assert batch_for(8) == (16, 4096)


def test_the_infilling_example_gives_both_pieces_and_shows_the_gap_in_brackets():
    encoding = load_gpt2()
    spec, seq_len = demo.infill_spec(encoding)
    pieces = {int(start): encoding.encode_ordinary(text)
              for start, text in json.loads(spec).items()}
    (before_at, before), (after_at, after) = sorted(pieces.items())
    assert before_at == 0 and after_at == len(before) + demo.INFILL_GAP == seq_len - len(after)
    gap = encoding.encode_ordinary(" whether 'tis nobler in the mind to suffer")[:demo.INFILL_GAP]
    assert len(gap) == demo.INFILL_GAP
    record = {"tokens": before + gap + after,
              "given_positions": [*range(len(before)), *range(after_at, seq_len)]}
    assert demo.show_infill(record, encoding) == (f"{demo.INFILL_BEFORE}[{encoding.decode(gap)}]"
                                        f"{demo.INFILL_AFTER}")


@pytest.mark.parametrize("flag", ["--steps", "--eval-samples"])
def test_a_count_below_one_is_refused_before_any_stage_runs(flag, tmp_path, capsys):
    assert demo.main(["--out", str(tmp_path / "demo"), flag, "0"]) == 2
    assert capsys.readouterr().err == f"error: {flag} must be at least 1, got 0\n"
    assert not (tmp_path / "demo").exists()
