"""A reading added to model/orders.py READINGS either works in the sampler, the evaluator and
lm-eval, or stops the import of each site that has no entry for it, with a message naming every
site to extend: never read left to right or dropped with no error (third_reading.py adds one,
right to left, in a fresh interpreter)."""

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from eval_testing import build_wikitext, save_checkpoint

from aogpt.model.orders import READING_SITES, READING_WORDS, UnhandledReading, per_reading

REPO = Path(__file__).resolve().parents[2]
THIRD_READING = Path(__file__).with_name("third_reading.py")


@pytest.fixture(scope="module")
def third_reading(tmp_path_factory) -> dict:
    """What third_reading.py found, unhandled and handled, on a tiny checkpoint and eval set."""
    root = tmp_path_factory.mktemp("third_reading")
    data = build_wikitext(root / "wikitext2", seq_len=12, lines=12)
    checkpoint = save_checkpoint(root / "ckpt")
    done = subprocess.run([sys.executable, str(THIRD_READING), str(checkpoint), str(data)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_site_without_an_entry_for_a_new_reading_fails_at_import_naming_every_site(
        third_reading):
    errors = third_reading["unhandled"]
    assert set(errors) == set(READING_SITES)
    for site, error in errors.items():
        assert error is not None, f"{site} imported with no entry for the new reading"
        assert error.startswith(f"model/orders.py READINGS has 'r2l', which {site} does not "
                                "handle: a reading needs an entry in each of ")
        assert all(other in error for other in READING_SITES)
        assert "docs/extending.md" in error


def test_a_new_reading_given_its_entries_samples_scores_and_is_refused_by_lm_eval(third_reading):
    found = third_reading["handled"]
    # the sampler generates right to left
    assert found["sampled_orders"] == [list(range(11, -1, -1))] * 2
    # the evaluator scores it, along the reversed order, as an exact likelihood
    scored = found["evaluated"]
    assert {"l2r", "r2l"} <= set(scored)
    # the same fp32 per-token values from the same batches, summed in float64 in another order
    assert scored["r2l"]["nll"] == pytest.approx(found["direct_r2l_nll"], rel=1e-9)
    assert "num_orders" not in scored["r2l"] and scored["r2l"]["tokens"] == scored["l2r"]["tokens"]
    assert not math.isclose(scored["r2l"]["nll"], scored["l2r"]["nll"], rel_tol=1e-6)
    # lm-eval refuses it with the reason its entry gives, and says what it scores instead
    assert found["lm_eval"] == ("order='right_to_left': lm-eval's tasks need exact likelihoods, "
                                "and right to left reads a continuation before its context: give "
                                "l2r (also ltr, left_to_right) or ensemble:M (M >= 1 members, "
                                "e.g. ensemble:8)")


def test_a_table_must_name_each_reading_once_and_no_other():
    site = READING_SITES[0]
    entries = dict.fromkeys(READING_WORDS, 0)
    assert per_reading(site, entries) is entries
    with pytest.raises(UnhandledReading, match=f"READINGS has 'random', which {site} does not "):
        per_reading(site, {word: 0 for word in READING_WORDS if word != "random"})
    with pytest.raises(UnhandledReading, match=f"READINGS has no 'r2l', which {site} names"):
        per_reading(site, {**entries, "r2l": 0})
    with pytest.raises(UnhandledReading, match="not listed in model/orders.py READING_SITES"):
        per_reading("trainer/new.py TABLE", entries)


def test_reading_sites_lists_every_table_built_by_per_reading():
    """READING_SITES is what a new reading's message names: each call of per_reading in the
    source, and only those."""
    calls = set()
    for folder in ("model", "trainer", "tools", "benchmarks", "experiments", "data_prep"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "per_reading"
                        and node.args and isinstance(node.args[0], ast.Constant)):
                    site = node.args[0].value
                    assert site.startswith(path.relative_to(REPO).as_posix() + " "), site
                    calls.add(site)
    assert calls == set(READING_SITES)
