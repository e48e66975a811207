"""tools/demo.py picks a batch that the trainer accepts on any number of GPUs."""

import importlib.util

import pytest
from conftest import REPO

from aogpt.trainer.config import load_config

spec = importlib.util.spec_from_file_location("demo", REPO / "tools" / "demo.py")
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)


@pytest.mark.parametrize("processes", range(1, 17))
def test_demo_batch_is_accepted_by_the_trainer_on_any_gpu_count(processes):
    micro_batch, tokens_per_step = demo.demo_batch(processes)
    cfg = load_config(REPO / "configs" / "tiny.yaml", [f"train.micro_batch_size={micro_batch}",
                                                       f"train.tokens_per_step={tokens_per_step}"])
    cfg.validate(world_size=processes)  # raises a UsageError for a batch that does not divide
    accumulation = cfg.gradient_accumulation_steps(processes)  # what DeepSpeed is given
    assert cfg.sequences_per_step == micro_batch * processes * accumulation
    assert 1 <= micro_batch <= 8 and 1 <= accumulation <= 4
    assert abs(tokens_per_step - 4096) <= 4096 // 5  # close to tiny.yaml's batch


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_demo_keeps_tiny_yamls_batch_where_it_divides(processes, repo):
    tiny = load_config(repo / "configs" / "tiny.yaml")
    assert demo.demo_batch(processes) == (tiny.train.micro_batch_size, tiny.train.tokens_per_step)


def test_demo_batch_on_eight_gpus_keeps_4096_tokens_with_smaller_micro_batches():
    assert demo.demo_batch(8) == (4, 4096)
