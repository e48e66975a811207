"""A third reading, right to left, added to model/orders.py READINGS in a fresh interpreter
before any site that does something per reading is imported (test_reading_sites.py runs it).

    python third_reading.py CHECKPOINT DATA

prints, as JSON, {"unhandled": for each site of READING_SITES, the error of importing its module
with every other site given its entry; "handled": with every site given its entry, what the
sampler generates, what trainer/evaluate.py scores on DATA with CHECKPOINT (and the network's
own right-to-left nll), and what lm-eval says of the reading}. One interpreter does both: torch
and the sites are imported once.

A site is given its entry as a developer would write it, by adding it to the site's table: the
table is checked by per_reading at import, so the entry is added there.
"""

import importlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

import aogpt.model.orders as orders
from aogpt import UsageError

RIGHT_TO_LEFT = orders.Reading("r2l", "r2l", "right to left", ("rtl", "right_to_left"))
orders.READINGS = (*orders.READINGS, RIGHT_TO_LEFT)
orders.READING_WORDS = tuple(reading.word for reading in orders.READINGS)
orders._BY_NAME.update({name: RIGHT_TO_LEFT for name in RIGHT_TO_LEFT.names})
orders.ALIASES.update({alias: RIGHT_TO_LEFT.word for alias in RIGHT_TO_LEFT.aliases})

REPO = Path(__file__).resolve().parents[2]
# each site's module, and the entry a developer adds to its table
MODULES = {"model/sampler/engine.py ORDER_KEYS": "aogpt.model.sampler.engine",
           "trainer/evaluation.py READING_SCORES": "aogpt.trainer.evaluation",
           "trainer/lm_harness.py LM_EVAL_READINGS": "aogpt.trainer.lm_harness",
           "tools/plot_metrics.py STYLES": "tools/plot_metrics.py"}
LM_EVAL_REFUSAL = "right to left reads a continuation before its context"


def _reversed_keys(config, sample_ids: torch.Tensor, n: int) -> torch.Tensor:
    positions = torch.arange(n, device=sample_ids.device)
    return (n - 1 - positions).double().expand(len(sample_ids), n) / n


def _entry(site: str):
    if site.startswith("model/sampler/engine.py"):
        return _reversed_keys
    if site.startswith("trainer/evaluation.py"):
        evaluation = sys.modules["aogpt.trainer.evaluation"]  # being imported: the table is last

        def reversed_orders(sampler, k, sample_indices, lengths, n):
            flipped = torch.arange(n, device=sample_indices.device).flip(0)
            return evaluation.real_first(flipped.expand(len(sample_indices), n), lengths)

        return evaluation.ReadingScore(reversed_orders, random=False)
    if site.startswith("tools/plot_metrics.py"):
        return "-."
    return LM_EVAL_REFUSAL


def import_site(module: str) -> None:
    if module.endswith(".py"):  # a script of tools/, not a package's module
        spec = importlib.util.spec_from_file_location(Path(module).stem, REPO / module)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    else:
        importlib.import_module(module)


handled: set[str] = set()
per_reading = orders.per_reading


def per_reading_with_entries(site: str, entries: dict) -> dict:
    if site in handled:
        entries = {**entries, RIGHT_TO_LEFT.word: _entry(site)}
    return per_reading(site, entries)


def forget_sites() -> None:
    """Drops the site modules (and what imports them) so that the next import runs their tables
    again: importing model/orders.py imported the sampler's already (aogpt.model's __init__)."""
    for name in [name for name in sys.modules
                 if name.startswith(("aogpt.model.sampler", "aogpt.model.hf", "aogpt.trainer"))]:
        del sys.modules[name]


orders.per_reading = per_reading_with_entries
forget_sites()


def unhandled() -> dict:
    errors = {}
    for site, module in MODULES.items():
        handled.clear()
        handled.update(set(MODULES) - {site})
        forget_sites()
        try:
            import_site(module)
            errors[site] = None
        except orders.UnhandledReading as err:
            errors[site] = str(err)
    return errors


def handled_everywhere(checkpoint: str, data: str) -> dict:
    handled.update(MODULES)
    import_site(MODULES["tools/plot_metrics.py STYLES"])  # draws the reading's curves
    from aogpt.model import load_checkpoint
    from aogpt.model.sampler import KVCacheSampler, SamplingConfig
    from aogpt.trainer.evaluate import main as evaluate
    from aogpt.trainer.evaluation import EvalData
    from aogpt.trainer.lm_harness import parse_order

    model = load_checkpoint(checkpoint, weights="ema").eval()
    n = 12
    generation = KVCacheSampler(model, 2, n, SamplingConfig(steps=n, order="rtl")).generate(
        torch.arange(2))
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "eval.json"
        assert evaluate(["--ckpt", checkpoint, "--data", data, "--orders", "l2r,r2l",
                         "--json", str(report), "--batch-size", "4"]) == 0
        results = json.loads(report.read_text())["results"][0]
    with torch.no_grad():  # the right-to-left nll straight from the network
        nll = tokens = 0.0
        for _, idx, lengths in EvalData(data, model.config.block_size).batches(0, 1, 4):
            b, t = idx.shape
            assert bool((lengths == t).all())  # concat packing: no padding to read first
            nll += float(model(idx, torch.arange(t).flip(0).expand(b, t)).double().sum())
            tokens += b * t
    try:
        parse_order("right_to_left")
        refusal = None
    except UsageError as err:
        refusal = str(err)
    return {"sampled_orders": generation.orders.tolist(), "evaluated": results,
            "direct_r2l_nll": nll / tokens, "lm_eval": refusal}


if __name__ == "__main__":
    errors = unhandled()
    forget_sites()
    print(json.dumps({"unhandled": errors, "handled": handled_everywhere(*sys.argv[1:])}))
