"""One vocabulary of orders (model/orders.py's READINGS): every word of a reading names it, the
same in training, sampling and evaluation, and is written once in the source; the random streams'
ids are one table of distinct values."""

import ast
from pathlib import Path

import pytest
import torch

from aogpt import UsageError
from aogpt.model import AOGPT, ModelConfig, OrderConfig, OrderSampler
from aogpt.model.orders import ANY_ORDER, KINDS, LEFT_TO_RIGHT, READINGS, Stream, reading_named
from aogpt.model.sampler import KVCacheSampler, SamplingConfig

REPO = Path(__file__).resolve().parents[2]
ALL_NAMES = [(reading, name) for reading in READINGS for name in reading.names]


def test_the_words_and_metric_names_are_the_documented_interface():
    assert (LEFT_TO_RIGHT.word, LEFT_TO_RIGHT.metric, LEFT_TO_RIGHT.label) == (
        "l2r", "l2r", "left to right")
    assert (ANY_ORDER.word, ANY_ORDER.metric, ANY_ORDER.label) == ("random", "ao", "any order")
    assert {"uniform", "ao", "any", "any_order"} <= set(ANY_ORDER.aliases)
    assert {"ltr", "left_to_right"} <= set(LEFT_TO_RIGHT.aliases)


def test_every_word_names_one_reading_and_no_other_order_kind():
    names = [name for _, name in ALL_NAMES]
    assert len(names) == len(set(names))
    others = {*KINDS, "ensemble", "none", "unigram"} - {reading.word for reading in READINGS}
    assert not set(names) & others  # e.g. evaluate.py's 'none', lm-eval's 'ensemble:M'


@pytest.mark.parametrize("reading, name", ALL_NAMES, ids=[name for _, name in ALL_NAMES])
def test_a_word_or_alias_names_its_reading(reading, name):
    assert reading_named(name, "--orders") is reading


def test_an_unknown_word_is_one_line_naming_the_accepted_words():
    with pytest.raises(UsageError) as err:
        reading_named("reverse", "--orders")
    assert str(err.value) == ("--orders: 'reverse' names no order: use l2r (also ltr, "
                              "left_to_right) or random (also uniform, ao, any, any_order)")


def test_random_stream_ids_are_distinct_and_keep_their_values():
    # a renumbered id would change every order, sample and ensemble member drawn with it
    assert len({int(stream) for stream in Stream}) == len(Stream)
    assert {stream.name: int(stream) for stream in Stream} == {
        "PERMUTATION": 1, "COIN": 2, "BLOCKS": 3, "PLANNED": 4, "GIVEN": 5,
        "PLANNER_SAMPLE": 6, "SAMPLE_ORDER": 11, "REVEAL": 12, "TOKEN": 13,
        "ACCEPT": 14, "RESIDUAL": 15, "PLAN": 16,
        "ENSEMBLE_TARGETS": 101, "ENSEMBLE_MEMBERS": 102}


@pytest.mark.parametrize("reading, name", ALL_NAMES, ids=[name for _, name in ALL_NAMES])
def test_an_order_kind_alias_draws_the_orders_of_its_word(reading, name):
    config = OrderConfig(kind=name)
    assert config.kind == reading.word
    samples = torch.arange(6)
    aliased = OrderSampler(config, 16, seed=3)(5, samples)
    canonical = OrderSampler(OrderConfig(kind=reading.word), 16, seed=3)(5, samples)
    assert all(torch.equal(a, c) for a, c in zip(aliased, canonical, strict=True))


@pytest.mark.parametrize("reading, name", ALL_NAMES, ids=[name for _, name in ALL_NAMES])
def test_a_sampling_order_alias_draws_the_tokens_of_its_word(reading, name):
    torch.manual_seed(0)
    model = AOGPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, cond_dim=8)).eval()

    def generate(order: str):
        config = SamplingConfig(steps=4, order=order, seed=1)
        return config, KVCacheSampler(model, 2, 8, config).generate(torch.arange(2))

    config, aliased = generate(name)
    _, canonical = generate(reading.word)
    assert config.order == reading.word
    assert torch.equal(aliased.tokens, canonical.tokens)
    assert torch.equal(aliased.orders, canonical.orders)


def test_a_sampling_order_that_names_no_reading_is_refused():
    with pytest.raises(UsageError, match="order: 'reverse' names no order: use l2r"):
        SamplingConfig(order="reverse")


# Literals that spell an order word outside model/orders.py, each with why it may.
ALLOWED = {
    # the findings suite's arm names: folders of its committed runs (docs/findings/runs/l2r-s1337,
    # uniform-s1337), named once in plan.ARMS and compared by name in the report; they name
    # training recipes, not readings, and stay as they are
    ("experiments/plan.py", "l2r"): 1,
    ("experiments/plan.py", "uniform"): 2,  # and the arm finding F races the recipes against
    ("experiments/report.py", "l2r"): 3,
    ("experiments/report.py", "uniform"): 2,
    # the race's two contestants, the AO-GPT run ("ao") and the GPT run: a network, not a reading
    ("benchmarks/sampling_race.py", "ao"): 6,
}


def test_order_words_are_string_literals_only_in_model_orders():
    """grep for the vocabulary: a word, alias, metric word or label of a reading appears as a
    string literal (docstrings and comments are not) only where READINGS defines it."""
    words = {word for reading in READINGS
             for word in (*reading.names, reading.metric, reading.label)}
    found: dict[tuple[str, str], int] = {}
    for folder in ("model", "trainer", "tools", "data_prep", "benchmarks", "experiments"):
        for path in sorted((REPO / folder).rglob("*.py")):
            name = path.relative_to(REPO).as_posix()
            if name == "model/orders.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), name)):
                if isinstance(node, ast.Constant) and node.value in words:
                    found[name, node.value] = found.get((name, node.value), 0) + 1
    assert found == ALLOWED
