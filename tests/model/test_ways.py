"""The ways of choosing tokens are one closed table (model/sampler/ways.py): an entry lacking a
part, or a strategy breaking the Strategy protocol, stops the import; a name of no way reaches no
code; each strategy writes only the engine state it declares; each way's call estimate holds; and
nothing outside model/sampler/ compares a way's name or imports a strategy into the engine."""

import ast
import dataclasses
import functools
import importlib.util
import subprocess
import sys

import pytest
import torch
from conftest import REPO, perturbed_float64_model

from aogpt import UsageError
from aogpt.model.config import ModelConfig
from aogpt.model.sampler import KVCacheSampler, SamplingConfig
from aogpt.model.sampler.parallel import ParallelSampling
from aogpt.model.sampler.strategy import Strategy
from aogpt.model.sampler.ways import PARTS, WAYS, IncompleteWay, Way, way_of

N, B = 12, 3
# the settings each way runs with below (every way of the table: a new one needs its line)
SETTINGS = {"parallel": {"steps": 5}, "speculative": {"sampler": "speculative", "draft": 3},
            "confidence": {"planner": "confidence", "reveal": 2},
            "margin": {"planner": "margin", "block": 4, "reveal": 3},
            "entropy": {"planner": "entropy", "candidates": 3},
            "threshold": {"planner": "threshold", "threshold": 0.5}}


def parts_of(name: str) -> dict:
    way = WAYS[name]
    return {part: getattr(way, part) for part in PARTS}


@pytest.mark.parametrize("missing", PARTS)
def test_a_way_lacking_a_part_fails_at_import_naming_it(tmp_path, missing):
    """A module that adds a seventh way without one of its parts cannot be imported."""
    module = tmp_path / "seventh_way.py"
    module.write_text(
        "from aogpt.model.sampler.ways import WAYS, Way\n"
        f"parts = {{part: getattr(WAYS['parallel'], part) for part in {PARTS!r}}}\n"
        f"del parts[{missing!r}]\n"
        "SEVENTH = Way('seventh', **parts)\n")
    spec = importlib.util.spec_from_file_location("seventh_way", module)
    with pytest.raises(IncompleteWay) as err:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert str(err.value).startswith(f"model/sampler/ways.py: the way 'seventh' has no {missing}: "
                                     "every way owns ")
    assert "docs/extending.md" in str(err.value)


def test_a_complete_way_is_accepted():  # the test above fails for the part it removes only
    assert Way("seventh", **parts_of("parallel")).strategy is ParallelSampling


def test_a_strategy_lacking_a_protocol_member_is_refused():
    class NoStep(Strategy):
        def generate(self, sample_ids, given_mask, on_step, forced_tokens):
            return None

        def state(self):
            return []

        def decided(self):
            return None

    with pytest.raises(IncompleteWay, match="NoStep, that does not define step"):
        Way("stepless", **{**parts_of("parallel"), "strategy": NoStep})
    with pytest.raises(IncompleteWay, match="that is no strategy.Strategy"):
        Way("plain", **{**parts_of("parallel"), "strategy": object})


def test_a_strategy_writing_engine_state_it_may_not_is_refused():
    class WritesUniforms(ParallelSampling):
        writes = frozenset({"ordered", "uniforms"})

    with pytest.raises(IncompleteWay, match=r"writes \['ordered', 'uniforms'\]"):
        Way("greedy", **{**parts_of("parallel"), "strategy": WritesUniforms})


def test_an_unknown_planner_name_reaches_no_way():
    config = SamplingConfig()
    config.planner = "boldest"  # past __init__, as a hand-edited record might be
    with pytest.raises(UsageError, match="planner='boldest' is unknown: use one of order, "):
        way_of(config)
    with pytest.raises(UsageError, match="planner='boldest' is unknown"):
        KVCacheSampler(model(), B, N, config)


def test_the_settings_here_cover_every_way():
    assert {way_of(SamplingConfig(**settings)).name for settings in SETTINGS.values()} == set(WAYS)


@functools.cache
def model():
    """A tiny one of 64 token ids (the sampler's work scales with the vocabulary)."""
    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=N, cond_dim=8, vocab_size=64)
    network = perturbed_float64_model(config)
    with torch.no_grad():
        network.lm_head.weight.mul_(30.0)  # peaked: drafts accepted, thresholds reached
    return network


@pytest.mark.parametrize("name", SETTINGS)
def test_each_strategy_writes_only_the_engine_state_it_declares(name):
    sampler = KVCacheSampler(model(), B, N, SamplingConfig(seed=1, **SETTINGS[name]))
    engine = ("orders", "ordered", "uniforms")
    seen, changed = [], set()

    def after_call(step):
        now = [getattr(sampler, tensor).clone() for tensor in engine]
        if seen:
            changed.update(t for t, a, b in zip(engine, seen[-1], now, strict=True)
                           if not torch.equal(a, b))
        seen.append(now)

    sampler.generate(torch.arange(B), on_step=after_call)
    assert len(seen) > 2 and "ordered" in changed
    assert changed <= sampler.strategy.writes
    # the planners decide the order as they go, and say so
    assert ("orders" in changed) == (WAYS[name].picked_by == "planner")


@pytest.mark.parametrize("name", SETTINGS)
def test_each_ways_call_estimate_is_its_calls_or_a_bound(name):
    """Exact where the calls are planned (parallel's deterministic counts, a planner revealing
    `reveal` per call); a bound where the draws decide (speculative drafts, the threshold)."""
    config = SamplingConfig(seed=1, **SETTINGS[name])
    out = KVCacheSampler(model(), B, N, config).generate(torch.arange(B))
    estimate = WAYS[name].calls(config, N)
    if name in ("speculative", "threshold"):
        assert out.network_calls <= estimate
    else:
        assert out.network_calls == estimate


# ---- nothing outside model/sampler/ knows a way by name ----------------------------------------

NAMES = set(WAYS)


def name_comparisons(source: str) -> list[str]:
    """Each comparison with a way's name (==, !=, in, not in: against the word itself or a
    literal tuple, list or set holding it) and each slice of PLANNERS or SAMPLERS by position."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                words = [side] if isinstance(side, ast.Constant) else getattr(side, "elts", [])
                if any(isinstance(w, ast.Constant) and w.value in NAMES for w in words):
                    found.append(ast.unparse(node))
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                and node.value.id in ("PLANNERS", "SAMPLERS")):
            found.append(ast.unparse(node))
    return found


def test_the_name_check_sees_every_form_of_comparison():
    snippet = ("a = config.planner == 'threshold'\nb = 'speculative' != s\n"
               "c = p in ('margin', 'entropy')\nd = PLANNERS[1:]\ne = SAMPLERS[0]\n"
               "f = p == 'order'\ng = {'sampler': 'parallel'}\n")
    assert len(name_comparisons(snippet)) == 5


def outside_files() -> dict[str, str]:
    """Every Python file of the repository (tracked, or new and not ignored: no run folder's)
    outside model/sampler/ and tests/, by path."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                             "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    return {name: (REPO / name).read_text() for name in listed.stdout.split()
            if not name.startswith(("model/sampler/", "tests/")) and (REPO / name).is_file()}


def test_nothing_outside_the_sampler_compares_a_ways_name():
    files = outside_files()
    assert {"trainer/sample.py", "trainer/evaluation.py", "trainer/config.py", "setup.py",
            "benchmarks/sampler_pareto.py", "benchmarks/sudoku_planners.py"} <= set(files)
    found = {name: hits for name, text in files.items() if (hits := name_comparisons(text))}
    assert found == {}, f"ask model/sampler/ways.py's table instead: {found}"


def test_the_engine_imports_no_strategy():
    tree = ast.parse((REPO / "model/sampler/engine.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    strategies = {f"aogpt.model.sampler.{m}" for m in ("parallel", "speculative", "planners")}
    assert "aogpt.model.sampler.ways" in imported and not imported & strategies
    assert sys.modules[WAYS["parallel"].strategy.__module__]  # the table holds them instead


def test_forced_tokens_reach_the_strategy_through_generate_only():
    """No attribute set from outside: a planner's forced tokens come with generate's arguments
    and are gone after it."""
    sampler = KVCacheSampler(model(), B, N, SamplingConfig(planner="margin"))
    text = torch.randint(0, 40, (B, N))
    assert torch.equal(sampler.generate(torch.arange(B), forced_tokens=text).tokens, text)
    assert sampler.strategy.forced is None
    assert not torch.equal(sampler.generate(torch.arange(B)).tokens, text)


def test_options_are_fields_of_the_config():
    fields = {f.name for f in dataclasses.fields(SamplingConfig)}
    assert {option.field for way in WAYS.values() for option in way.options} <= fields
