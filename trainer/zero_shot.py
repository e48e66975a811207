"""Zero-shot sets scored while training: the paper's curves (its Figures 1-2, tables), one run.

Every `eval.every` steps each folder of `eval.sets` (made by data_prep/eval_to_mds.py) is scored
with the EMA weights, and with the raw ones when `eval.raw_weights`, exactly as
trainer/evaluate.py scores it (trainer/evaluation.py's Evaluator, the same code): the exact
left-to-right perplexity and the any-order bound over `eval.num_orders` orders per sequence
(the paper uses 10), token-weighted over ranks. The orders are keyed by (EVAL_ORDER_SEED, the
sample's index in the set), so every evaluation of a run, resumed or run on another number of
processes, scores the same orders, and the curve compares with itself; evaluate.py gives the same
numbers for a checkpoint of that step with `--seed 20250624 --num-orders K` and the weights and
precision used here. `eval.max_tokens` keeps each round to the first samples of each set.

Metrics, one name per set (the folder's name), weights and reading, in metrics.jsonl and wandb:

    eval/<set>/<ema|raw>/l2r_nll, .../l2r_ppl     left to right: the exact perplexity
    eval/<set>/<ema|raw>/ao_nll,  .../ao_ppl      any order: the bound (the AO-AR loss)
    eval_s, eval_fraction                         the round's seconds, and their share of the
                                                  time since the round before (or the start)

tools/plot_metrics.py draws them against tokens, one panel per set.
"""

from __future__ import annotations

from pathlib import Path

from aogpt import UsageError
from aogpt.model import AOGPT
from aogpt.model.orders import ANY_ORDER, LEFT_TO_RIGHT, READING_WORDS, READINGS
from aogpt.trainer.evaluation import EvalData, EvalSettings, Evaluator

EVAL_ORDER_SEED = 20250624  # evaluation orders never change, so evaluations compare across a run
EVAL_TO_MDS = "python data_prep/eval_to_mds.py --dataset NAME"


def metric_name(set_name: str, weights: str, reading: str, stat: str) -> str:
    """reading: a Reading's metric word (l2r, ao)."""
    return f"eval/{set_name}/{weights}/{reading}_{stat}"


def open_sets(folders: list[str], block_size: int, max_tokens: int | None,
              vocab_size: int | None = None) -> dict[str, EvalData]:
    """The eval.sets folders by their metric name (the folder's name), each checked: an eval set
    made by data_prep/eval_to_mds.py with GPT-2's tokenizer at the model's block size, not empty.
    UsageError (one line) otherwise, whose command builds the set into a new folder: never into
    what the user named, when that is a file, another kind of data or a set of other samples."""
    max_samples = None if max_tokens is None else max_tokens // block_size
    sets = {}
    for folder in folders:
        path = Path(folder)
        build = f"{EVAL_TO_MDS} --seq-len {block_size}"
        if not path.exists():
            raise UsageError(f"eval.sets: {folder} does not exist: build it with {build} "
                             f"--out {folder}")
        if not path.is_dir():
            raise UsageError(f"eval.sets: {folder} is a file, not an eval set: build one from it "
                             f"with {build} --source {folder} --out {new_folder(path, block_size)} "
                             "and list that folder")
        if not (path / "manifest.json").is_file():
            raise UsageError(f"eval.sets: {folder} holds no manifest.json, it was not made by "
                             f"data_prep: build an eval set with {build} --out "
                             f"{new_folder(path, block_size)} and list that folder")
        data = EvalData(folder, block_size, max_samples, vocab_size=vocab_size)  # checks tokens
        if data.manifest["kind"] != "eval":
            raise UsageError(f"eval.sets: {folder} is a {data.manifest['kind']} folder, not an "
                             f"eval set (its val split is scored by eval.batches): build an eval "
                             f"set with {build} --out {new_folder(path, block_size)} and list "
                             "that folder")
        if data.seq_len != block_size:
            raise UsageError(f"eval.sets: {folder} has samples of {data.seq_len} tokens, the model "
                             f"reads {block_size} (model.block_size): build the set again with "
                             f"{EVAL_TO_MDS} --seq-len {block_size} --out "
                             f"{new_folder(path, block_size)} and list that folder")
        if data.num_samples == 0:
            raise UsageError(f"eval.sets: {folder} holds no samples: rebuild it from more text, "
                             "or leave it out of eval.sets")
        sets[path.name] = data
    return sets


def new_folder(path: Path, block_size: int) -> Path:
    """A folder that does not exist yet, beside `path`, for an eval set of `block_size` tokens."""
    candidate = path.with_name(f"{path.stem}-eval-{block_size}")
    number = 2
    while candidate.exists():
        candidate, number = path.with_name(f"{path.stem}-eval-{block_size}-{number}"), number + 1
    return candidate


def settings(model: AOGPT, precision: str, batch_size: int, num_orders: int) -> EvalSettings:
    """What in-training evaluation scores: every reading where the model reads any order."""
    orders = READING_WORDS if model.config.any_order else (LEFT_TO_RIGHT.word,)
    return EvalSettings(orders=orders, num_orders=num_orders, batch_size=batch_size,
                        seed=EVAL_ORDER_SEED, precision=precision)


def score(evaluator: Evaluator, data: EvalData, weights: str, set_name: str) -> dict[str, float]:
    """One set's metrics under one set of weights (collective: every rank runs it)."""
    result = evaluator.score_data(data)
    return {metric_name(set_name, weights, reading.metric, stat): result[reading.word][stat]
            for reading in READINGS if reading.word in result for stat in ("nll", "ppl")}


def describe(record: dict, set_names: list[str], weights: str) -> str:
    """The log line of a round: each set's perplexities under `weights`, then what it cost."""
    parts = []
    for name in set_names:
        l2r = record.get(metric_name(name, weights, LEFT_TO_RIGHT.metric, "ppl"))
        ao = record.get(metric_name(name, weights, ANY_ORDER.metric, "ppl"))
        reading = f"{name} ppl {'n/a' if l2r is None else f'{l2r:.2f}'}"
        if ao is not None:
            reading += f" ({ANY_ORDER.label} <= {ao:.2f})"
        parts.append(reading)
    return (f"zero-shot ({weights} weights): {', '.join(parts)} | {record['eval_s']:.1f} s, "
            f"{100 * record['eval_fraction']:.1f}% of the time since the last evaluation")
