"""benchmarks/perfect_drafts.py: the speculative sampler's rule run with a synthetic language as
its model. Its rule is the sampler's (run with a network as its model, it takes the sampler's
calls per token), its texts are the language's (exact), and pre-drafts save calls."""

import json
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, perturbed_float64_model, run_cli

from aogpt.model.config import ModelConfig
from aogpt.model.sampler import KVCacheSampler, SamplingConfig

sys.path.insert(0, str(REPO / "benchmarks"))
import perfect_drafts  # noqa: E402
from race_table import TINY_LANGUAGE  # noqa: E402


@pytest.fixture(scope="module")
def language(tmp_path_factory):
    data = tmp_path_factory.mktemp("perfect") / "language"
    built = run_cli("data_prep/synthetic_to_mds.py", "--out", str(data), *TINY_LANGUAGE)
    assert built.returncode == 0, built.stderr
    return data


class NetworkModel:
    """perfect_drafts' model interface answered by a network: a state is (the tokens known, left
    to right, and how many positions after them are unknown); its distribution is the network's
    for the position after those, given the tokens known (an order that reads them, then it)."""

    def __init__(self, network, n: int, config: SamplingConfig):
        self.network, self.n, self.config, self.memo = network, n, config, {}

    def start(self):
        return (), 0

    def observe(self, state, token: int):
        known, unknown = state
        assert unknown == 0
        return known + (token,), 0

    def advance(self, state):
        return state[0], state[1] + 1

    def tokens(self, state) -> np.ndarray:
        if state not in self.memo:
            known, unknown = state
            k, asked = len(known), len(state[0]) + unknown
            order = [*range(k), asked, *(i for i in range(k, self.n) if i != asked)]
            tokens = torch.tensor([*known, *[0] * (self.n - k)])[None]
            with torch.no_grad():
                logits = self.network.logits(tokens, torch.tensor(order)[None])[0, k]
            self.memo[state] = (torch.softmax(logits.double(), -1)).numpy()
        return self.memo[state]


@pytest.mark.parametrize("draft, predraft", [  # ~3 s each on an idle 2-core CPU
    pytest.param(2, 0, marks=pytest.mark.slow), (2, 2), pytest.param(3, 1, marks=pytest.mark.slow)])
def test_the_rule_is_the_samplers_its_calls_per_token_with_a_network_as_the_model(draft, predraft):
    """Run with a network (untrained, sharpened so that drafts are often rejected) as its model,
    the simulation takes the calls per token the sampler takes with that network, left to right,
    within the noise of 300 texts each (4 standard errors of the difference)."""
    n, texts = 8, 300
    network = perturbed_float64_model(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8,
                                                  cond_dim=8, vocab_size=6))
    with torch.no_grad():
        network.lm_head.weight.mul_(12.0)
    config = SamplingConfig(sampler="speculative", draft=draft, predraft=predraft, order="l2r")
    rng = np.random.default_rng(0)
    simulated = np.array([perfect_drafts.generate(NetworkModel(network, n, config), n, draft, 1,
                                                  predraft, rng)[1] for _ in range(texts)])
    sampler = KVCacheSampler(network, texts, n, config)
    sampled = sampler.generate(torch.arange(texts)).sample_calls.double().numpy()
    error = np.hypot(simulated.std(ddof=1), sampled.std(ddof=1)) / np.sqrt(texts)
    assert sampled.mean() < n - 1  # drafts are taken, and some rejected: the rule is exercised
    assert abs(simulated.mean() - sampled.mean()) < 4 * error


def test_perfect_drafts_are_exact_and_pre_drafts_save_calls(language, run_main, tmp_path):
    out = tmp_path / "perfect.json"
    code, stdout, _ = run_main(perfect_drafts.main, "--language", language, "--drafts", "1,3",
                               "--trees", "1,2", "--predrafts", "0,3", "--num-texts", "400",
                               "--gaps", "3", "--json", out)
    assert code == 0
    data = json.loads(out.read_text())
    rows = {row["sampler"]: row for row in data["results"]}
    assert list(rows) == ["K=1", "K=1 R=1", "K=3", "K=3 R=3",
                          "K=1 C=2", "K=1 C=2 R=1", "K=3 C=2", "K=3 C=2 R=3"]
    assert data["complete"] and data["provenance"]["made_by"] == "benchmarks/perfect_drafts.py"
    for row in rows.values():  # exact: the texts' NLL is the language's entropy
        assert abs(row["true_nll"] - data["entropy"]) < 4 * row["true_nll_se"]
        assert 1 / (row["draft"] + 1) <= row["calls_per_token"] < 1
        assert row["call_cost_for_2x"] == pytest.approx(1 / (2 * row["calls_per_token"]))
    for plain, fresh in (("K=3", "K=3 R=3"), ("K=3 C=2", "K=3 C=2 R=3")):  # 0.08, 0.06 fewer
        assert rows[fresh]["calls_per_token"] < rows[plain]["calls_per_token"] - 0.02
    gaps = data["gap_acceptance"]
    assert len(gaps) == 3 and 1 > gaps[0] > gaps[1] > gaps[2] > 0
    assert "| K=3 R=3 |" in stdout


def test_an_earlier_json_needs_force_and_gaps_must_fit_the_text(language, run_main, tmp_path):
    out = tmp_path / "perfect.json"
    assert run_main(perfect_drafts.main, "--language", language, "--drafts", "1", "--trees", "1",
                    "--predrafts", "0", "--num-texts", "2", "--json", out)[0] == 0
    code, _, err = run_main(perfect_drafts.main, "--language", language, "--json", out)
    assert code == 2 and "pass --force to replace it" in err and err.count("\n") == 1
    code, _, err = run_main(perfect_drafts.main, "--language", language, "--gaps", "16")
    assert code == 2 and "--gaps must be below the text's length (16), got 16" in err
