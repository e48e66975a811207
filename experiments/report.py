"""The findings report: each claim of the paper checked against the suite's numbers, as Markdown
and PNG.

    write_report(out)   # reads out/suite.json, out/runs/*/metrics.jsonl, out/evals/*.json,
                        # out/speed.json; writes out/report.md and out/*.png

A claim is a set of comparisons "arm A < arm B on metric m". A difference counts only when it
exceeds the noise: the spread (max - min) over the seeds of the arms compared, or where those
were trained with one seed, the largest spread of the arms that had several. Each finding then
reads "reproduced" (every comparison as claimed), "not reproduced" (one goes the other way) or
"inconclusive (within seed noise)".
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: runs on a node without a display
import matplotlib.pyplot as plt  # noqa: E402
from plan import RECIPE_BASELINE, RECIPES  # noqa: E402

from aogpt import UsageError  # noqa: E402
from aogpt.files import write_atomic, write_text_atomic
from aogpt.model.orders import ANY_ORDER, LEFT_TO_RIGHT  # noqa: E402
from aogpt.run_folder import RunFolder  # noqa: E402
from aogpt.trainer.metrics import curve, loss_key, run_records  # noqa: E402

TAIL = 0.1  # "final" loss: the mean over the last 10% of the steps
FLOOR_MARGIN = 0.05  # finding F: "within 5% of the entropy"
SMOOTH = 0.8  # exponential smoothing of plotted training curves
TIMING_MARGIN = 0.1  # timings within 10% of each other are treated as equal

AS_CLAIMED, OPPOSITE, WITHIN_NOISE = "as claimed", "opposite", "within noise"
# both sides are models that do not use their context yet: their gap says nothing of the claim
CONTEXT_FREE = "both on the unigram plateau"
REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"
UNDECIDED_HERE = "inconclusive (not yet using context)"
NOT_RUN = "not run"


# ---- the verdict logic (pure) --------------------------------------------------------------------


def spread(values: list[float]) -> float | None:
    """Max - min over seeds; None for a single seed (no estimate of the noise)."""
    return max(values) - min(values) if len(values) > 1 else None


def outcome(lower: list[float], higher: list[float], noise: float) -> str:
    """Whether the claim mean(lower) < mean(higher) holds by more than `noise`."""
    difference = statistics.fmean(higher) - statistics.fmean(lower)
    if difference > noise:
        return AS_CLAIMED
    if difference < -noise:
        return OPPOSITE
    return WITHIN_NOISE


def verdict(outcomes: list[str], noise_name: str = "seed noise") -> str:
    if not outcomes:
        return NOT_RUN
    if all(o == AS_CLAIMED for o in outcomes):
        return REPRODUCED
    if OPPOSITE in outcomes:
        return NOT_REPRODUCED
    if CONTEXT_FREE in outcomes:
        return UNDECIDED_HERE
    return f"inconclusive (within {noise_name})"


@dataclass
class Comparison:
    """The claim `lower` < `higher` on one metric; values are per seed."""

    metric: str
    lower_name: str
    lower: list[float]
    higher_name: str
    higher: list[float]
    noise: float
    noise_source: str
    context_free: bool = False  # every run on both sides is on the unigram plateau (on_plateau)

    @property
    def difference(self) -> float:
        return statistics.fmean(self.higher) - statistics.fmean(self.lower)

    @property
    def outcome(self) -> str:
        return CONTEXT_FREE if self.context_free else outcome(self.lower, self.higher, self.noise)

    def describe(self) -> str:
        relation = {AS_CLAIMED: ">", OPPOSITE: "< -", WITHIN_NOISE: "within ±"}[
            outcome(self.lower, self.higher, self.noise)]
        return (f"{self.metric}: {self.lower_name} {values_text(self.lower)} < "
                f"{self.higher_name} {values_text(self.higher)}? difference "
                f"{self.difference:+.4f} {relation} {self.noise:.4f} ({self.noise_source}): "
                f"**{self.outcome}**")


def noise_for(values: dict[str, list[float]], arms: tuple[str, ...]) -> tuple[float, str]:
    """The noise a difference between these arms must exceed: their own largest seed spread, or
    where they have one seed each, the largest spread of any arm with several."""
    own = {arm: spread(values[arm]) for arm in arms if spread(values[arm]) is not None}
    if own:
        return max(own.values()), f"seed spread of {', '.join(own)}"
    pooled = {arm: s for arm, v in values.items() if (s := spread(v)) is not None}
    if pooled:
        return max(pooled.values()), f"largest seed spread, of {', '.join(pooled)}"
    return 0.0, "one seed: no spread to compare with"


def compare_chain(metric: str, values: dict[str, list[float]],
                  pairs: list[tuple[str, str]]) -> list[Comparison]:
    """One Comparison per (lower arm, higher arm) pair whose arms both have values."""
    comparisons = []
    for lower, higher in pairs:
        if values.get(lower) and values.get(higher):
            noise, source = noise_for(values, (lower, higher))
            comparisons.append(Comparison(metric, lower, values[lower], higher, values[higher],
                                          noise, source))
    return comparisons


def falls_with_size(nll_by_seed: dict[int, dict[int, float]], standard_error: float
                    ) -> list[Comparison]:
    """Finding 5: the ensemble of the largest size beats a single order, and no size is worse than
    the one before it. Scores of one seed share their targets, so their differences are paired;
    the noise is the larger of the spread of the gain over seeds and the standard error of the
    target sampling."""
    sizes = sorted(next(iter(nll_by_seed.values())))
    gains = [by_size[sizes[0]] - by_size[sizes[-1]] for by_size in nll_by_seed.values()]
    gain_spread = spread(gains)
    noise = max(gain_spread or 0.0, standard_error)
    source = (f"the larger of the seed spread of the gain ({gain_spread:.4f}) and "
              if gain_spread is not None else "one seed: ") + (
        f"the standard error of the target sampling ({standard_error:.4f})")

    def claim(large: int, small: int) -> Comparison:
        return Comparison(f"nll, M={large} vs M={small}", f"M={large}",
                          [s[large] for s in nll_by_seed.values()], f"M={small}",
                          [s[small] for s in nll_by_seed.values()], noise, source)

    comparisons = [claim(sizes[-1], sizes[0])]
    # a plateau is fine; only a rise contradicts "falling with M"
    comparisons += [step for step in (claim(large, small) for small, large in zip(
        sizes, sizes[1:], strict=False)) if step.outcome == OPPOSITE]
    return comparisons


def speed_comparisons(rows: list[dict]) -> list[Comparison]:
    """Fig. 4's shape: the decoder is faster at the most steps, and the encoder's time grows with
    the number of steps faster than the decoder's (timings within TIMING_MARGIN count as equal)."""
    first, last = rows[0], rows[-1]
    source = f"timing margin {TIMING_MARGIN:.0%}"
    faster = Comparison(f"ln(seconds) at {last['steps']} steps", "decoder",
                        [math.log(last["decoder_s"])], "encoder", [math.log(last["encoder_s"])],
                        math.log(1 + TIMING_MARGIN), source)
    growth = Comparison(f"ln(time at {last['steps']} / time at {first['steps']} steps)",
                        "decoder", [math.log(last["decoder_s"] / first["decoder_s"])], "encoder",
                        [math.log(last["encoder_s"] / first["encoder_s"])],
                        math.log(1 + TIMING_MARGIN), source)
    return [faster, growth]


def curve_summary(records: list[dict], key: str = "loss") -> dict[str, float] | None:
    """final: mean over the last TAIL of the steps; auc: the area under the curve over the steps
    it spans, divided by that span (a mean loss, lower = converged sooner)."""
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    if not points:
        return None
    first, last = points[0][0], points[-1][0]
    tail = [value for step, value in points if step > last * (1 - TAIL)]
    if last == first:
        return {"final": statistics.fmean(tail), "auc": points[0][1], "steps": last}
    area = sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(points, points[1:],
                                                                     strict=False))
    return {"final": statistics.fmean(tail), "auc": area / (last - first), "steps": last}


def values_text(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.fmean(values):.4f} ({', '.join(f'{v:.4f}' for v in values)})"


# ---- reading the suite's outputs ----------------------------------------------------------------


@dataclass
class SuiteResults:
    out: Path
    suite: dict
    records: dict[str, list[dict]] = field(default_factory=dict)  # run name -> metrics
    evals: dict[str, dict] = field(default_factory=dict)  # run name -> evaluate.py's result
    ensembles: dict[str, dict] = field(default_factory=dict)
    speed: dict | None = None
    unigram_nll: float | None = None  # the context-free reference on the evaluated samples

    @property
    def runs(self) -> dict[str, dict]:
        return self.suite["runs"]

    def per_arm(self, value: Callable[[str], float | None]) -> dict[str, list[float]]:
        """arm -> the value of each of its runs (in seed order) that has one."""
        grouped: dict[str, list[float]] = {}
        for name, run in self.runs.items():
            v = value(name)
            if v is not None:
                grouped.setdefault(run["arm"], []).append(v)
        return grouped

    def curve(self, name: str, stat: str) -> float | None:
        summary = curve_summary(self.records.get(name, []))
        return summary[stat] if summary else None

    def eval_nll(self, name: str, kind: str) -> float | None:
        result = self.evals.get(name)
        return result[kind]["nll"] if result and kind in result else None


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def load_results(out: Path) -> SuiteResults:
    """Everything the report is built from, all inside `out` (the runs in out/runs/NAME): a copy
    of those files elsewhere (experiments/run.py --publish) rebuilds the same report."""
    suite = read_json(out / "suite.json")
    if suite is None:
        raise UsageError(f"{out / 'suite.json'} does not exist: run the suite into {out} first "
                         "(python experiments/run.py --suite findings --out DIR)")
    results = SuiteResults(out, suite)
    for name in suite["runs"]:
        if RunFolder(out / "runs" / name).metrics_file.is_file():
            results.records[name] = run_records(out / "runs" / name)
        for store, suffix in ((results.evals, ""), (results.ensembles, ".ensemble")):
            payload = read_json(out / "evals" / f"{name}{suffix}.json")
            if payload is not None:
                store[name] = payload["results"][0]
    results.speed = read_json(out / "speed.json")
    # the context-free reference, scored by each evaluation on its own samples (--unigram-from)
    results.unigram_nll = next((result["unigram"]["nll"] for result in results.evals.values()
                                if "unigram" in result), None)
    return results


# ---- the findings --------------------------------------------------------------------------------


@dataclass
class Finding:
    key: str
    title: str
    claim: str
    comparisons: list[Comparison]
    body: list[str]  # Markdown: tables, figures, notes
    noise_name: str = "seed noise"
    arms: tuple[str, ...] = ()  # whose runs explain an undecided verdict (context_free_runs)

    @property
    def verdict(self) -> str:
        return verdict([c.outcome for c in self.comparisons], self.noise_name)


def not_run(key: str, title: str, r: SuiteResults, arms: tuple[str, ...]) -> Finding | None:
    """A finding without all its arms in this suite (e.g. left out with --only) is not run."""
    have = {run["arm"] for run in r.runs.values()}
    missing = [arm for arm in arms if arm not in have]
    if not missing:
        return None
    return Finding(key, title, "", [], [f"Not run: needs the arm(s) {', '.join(missing)}."])


def training_loss_comparisons(r: SuiteResults, pairs: list[tuple[str, str]]) -> list[Comparison]:
    """lower < higher on the final and the mean (area under the curve) training loss."""
    comparisons = []
    for stat, label in (("final", "final training loss"), ("auc", "mean training loss (AUC)")):
        values = r.per_arm(lambda name, stat=stat: r.curve(name, stat))
        comparisons += compare_chain(label, values, pairs)
    return comparisons


def held_out_comparisons(r: SuiteResults, lower: str, higher: str) -> list[Comparison]:
    """Arm `lower` against arm `higher` on the held-out left-to-right and any-order NLL."""
    comparisons = []
    for kind, label in ((LEFT_TO_RIGHT.word, "held-out left-to-right nll"),
                        (ANY_ORDER.word, "held-out any-order nll (bound)")):
        values = r.per_arm(lambda name, kind=kind: r.eval_nll(name, kind))
        comparisons += compare_chain(label, values, [(lower, higher)])
    return comparisons


def finding_1(r: SuiteResults) -> Finding:
    arms = ("l2r", "uniform")
    title = "AO-GPT converges slower than the same decoder trained left to right"
    if skipped := not_run("1", title, r, arms):
        return skipped
    comparisons = training_loss_comparisons(r, [arms])
    figure = plot_training(r, arms, "finding1.png", "Finding 1: left to right vs any order")
    return Finding("1", title,
                   "Trained on uniformly random orders, the decoder's (any-order) training loss "
                   "stays above the left-to-right loss of the same network trained left to right.",
                   comparisons, [*figure, *arm_table(r, arms)])


def finding_2(r: SuiteResults) -> Finding:
    blocks = ("blockwise8", "blockwise32")
    arms = ("l2r", *blocks, "fixed_random")
    title = "Fixed orders: left to right < block-wise random < random"
    if skipped := not_run("2", title, r, arms):
        return skipped
    pairs = [("l2r", b) for b in blocks] + [(b, "fixed_random") for b in blocks]
    comparisons = on_plateau(r, training_loss_comparisons(r, pairs))
    figure = plot_training(r, arms, "finding2.png", "Finding 2: one fixed order per arm")
    return Finding("2", title,
                   "Each trained on one fixed order, the training loss (in the arm's own order) "
                   "converges fastest left to right, slower for a fixed block-wise random order "
                   "and slowest for a fixed fully random order.",
                   comparisons, [*figure, *arm_table(r, arms)], arms=arms)


def held_out_finding(r: SuiteResults, key: str, title: str, claim: str, lower: str, higher: str,
                     figure_file: str) -> Finding:
    """A finding claiming that arm `lower` beats arm `higher` on both held-out NLLs."""
    arms = (higher, lower)
    if skipped := not_run(key, title, r, arms):
        return skipped
    figure = plot_validation(r, arms, figure_file)
    return Finding(key, title, claim, on_plateau(r, held_out_comparisons(r, lower, higher)),
                   [*figure, *arm_table(r, arms), *against_unigram(r, arms)], arms=arms)


def finding_3(r: SuiteResults) -> Finding:
    return held_out_finding(
        r, "3", "10% left-to-right orders improve both losses",
        "AO-GPT trained with 10% of its sequences left to right has a lower left-to-right and a "
        "lower any-order validation loss than with 0%.", "mixture10", "uniform", "finding3.png")


def finding_curriculum(r: SuiteResults) -> Finding:
    return held_out_finding(
        r, "C", "Beyond the paper: a left-to-right curriculum against the constant 10%",
        "Reading left to right first (p_left_to_right 1.0 -> 0.1 over the first half of the run, "
        "then 0.1) gives a lower left-to-right and a lower any-order held-out loss than the "
        "paper's constant 10% for the same tokens.", "curriculum", "mixture10", "curriculum.png")


def finding_5(r: SuiteResults) -> Finding:
    title = "Context-order ensembles lower the perplexity"
    if skipped := not_run("5", title, r, ("mixture10",)):
        return skipped
    if not r.ensembles:
        return Finding("5", title, "", [], ["Not run: no ensemble evaluation finished."])
    sizes = _ensemble_sizes(r)
    rows = ["| run | " + " | ".join(f"M={m}" for m in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    nll_by_seed, errors = {}, []
    for name, result in r.ensembles.items():
        by_members = result["ensemble"]["by_members"]
        nll_by_seed[r.runs[name]["seed"]] = {int(m): s["nll"] for m, s in by_members.items()}
        errors.append(by_members[str(sizes[-1])]["nll_se"] or 0.0)
        rows.append(f"| {name} | " + " | ".join(
            f"{s['ppl']:.2f} ({s['nll']:.4f} ± {s['nll_se']:.4f})" for s in by_members.values())
            + " |")
    first = next(iter(r.ensembles.values()))["ensemble"]
    body = [*plot_ensemble(r, "finding5.png"),
            "Perplexity (nll ± standard error of the target sampling) by ensemble size M, "
            f"{first['targets_per_sequence']} targets per sequence, {first['tokens']:,} tokens:",
            "", *rows]
    return Finding("5", title,
                   "Averaging the probabilities of M re-orderings of the context lowers the "
                   "perplexity of AO-GPT (10% left to right) as M grows.",
                   on_plateau(r, falls_with_size(nll_by_seed, max(errors)),
                              lambda comparison: ("mixture10",)),
                   body, arms=("mixture10",))


def tokens_to_floor(records: list[dict], key: str, threshold: float) -> tuple[float, bool] | None:
    """(tokens trained, True) at the first in-training validation whose `key` loss is at most
    `threshold`; (the tokens of the last validation, False) when none is: a censored value, the
    run needs at least that many. None without validations."""
    points = [(r["tokens_seen"], r[key]) for r in records
              if r.get(key) is not None and r.get("tokens_seen") is not None]
    if not points:
        return None
    return next(((tokens, True) for tokens, value in points if value <= threshold),
                (points[-1][0], False))


def finding_floor(r: SuiteResults) -> Finding:
    """F: each order recipe's tokens to within FLOOR_MARGIN of the data's entropy, against
    uniform orders, where the entropy is known (the synthetic language)."""
    title = "Beyond the paper: the order recipes raced to the entropy"
    entropy = r.suite["data"].get("entropy")
    if entropy is None:
        return Finding("F", title, "", [], [
            "Not run: the data's entropy is not known (the synthetic language's is: "
            "`--corpus synthetic`)."])
    have = {run["arm"] for run in r.runs.values()}
    recipes = tuple(arm for arm in RECIPES if arm in have) or RECIPES
    arms = (RECIPE_BASELINE, *recipes)
    if skipped := not_run("F", title, r, arms):
        return skipped
    threshold = (1 + FLOOR_MARGIN) * entropy
    key = loss_key(ANY_ORDER, validation=True)
    reached = {name: tokens_to_floor(records, key, threshold)
               for name, records in r.records.items()}
    values = r.per_arm(lambda name: reached[name][0] / 1e6 if reached.get(name) else None)
    best = min((arm for arm in recipes if values.get(arm)),
               key=lambda arm: statistics.fmean(values[arm]))
    comparisons = compare_chain(f"million tokens to {threshold:.4f} nats in any order", values,
                                [(best, RECIPE_BASELINE)])
    censored = [name for name, run in r.runs.items()
                if run["arm"] in (best, RECIPE_BASELINE) and reached.get(name)
                and not reached[name][1]]
    note = ([f"Not reached by {', '.join(censored)}: their value is the tokens of their last "
             "validation, a lower bound: such a run needs more (where it is uniform's, the "
             "gap is larger than shown; where it is the recipe's, smaller).", ""]
            if censored else [])
    return Finding(
        "F", title,
        f"The best order recipe (of {', '.join(recipes)}: {best}) reaches within "
        f"{FLOOR_MARGIN:.0%} of the entropy ({entropy:.4f} nats per token, the loss of a perfect "
        "model) in any order, on the in-training validation, in fewer tokens than uniform "
        "orders, by more than the seed spread.",
        comparisons, [*note, *plot_floor(r, arms, entropy, threshold, "floor.png"),
                      *floor_table(r, threshold)])


def floor_table(r: SuiteResults, threshold: float) -> list[str]:
    """Every run's tokens to the threshold in both readings (">=": not reached in the run), its
    last validation and its held-out NLLs (the margin planner's order where scored)."""
    rows = ["", f"Tokens to {threshold:.4f} nats (in-training validation, EMA weights; \">=\": "
            "not reached by the run's last validation), and the held-out NLLs:", "",
            "| run | tokens, any order | tokens, left to right | last validation, any order | "
            "held-out any order | held-out left to right | held-out, margin planner's order |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for name in r.runs:
        records = r.records.get(name, [])
        cells = []
        for reading in (ANY_ORDER, LEFT_TO_RIGHT):
            found = tokens_to_floor(records, loss_key(reading, validation=True), threshold)
            cells.append("–" if found is None else f"{'' if found[1] else '>= '}{found[0]:,}")
        last = next((rec[loss_key(ANY_ORDER, validation=True)] for rec in reversed(records)
                     if rec.get(loss_key(ANY_ORDER, validation=True)) is not None), None)
        rows.append(f"| {name} | {' | '.join(cells)} | {_num(last)} | "
                    f"{_num(r.eval_nll(name, ANY_ORDER.word))} | "
                    f"{_num(r.eval_nll(name, LEFT_TO_RIGHT.word))} | "
                    f"{_num(r.eval_nll(name, 'planner margin'))} |")
    return rows


def finding_speed(r: SuiteResults) -> Finding:
    if not r.speed:
        return Finding("speed", "Decoder sampling with a KV cache vs encoder-style sampling", "",
                       [], ["Not run."])
    rows = r.speed["results"]
    table = ["| steps | decoder s | encoder s | encoder / decoder | decoder rows | encoder rows |",
             "|---:|---:|---:|---:|---:|---:|"]
    table += [f"| {row['steps']} | {row['decoder_s']:.3f} | {row['encoder_s']:.3f} | "
              f"{row['ratio']:.1f}x | {row['decoder_rows']:,} | {row['encoder_rows']:,} |"
              for row in rows]
    s = r.speed
    body = [*plot_speed(r, "sampling_speed.png"),
            f"benchmarks/generation_speed.py: preset {s['preset']} on {s['device']} "
            f"({s['dtype']}), batch {s['batch_size']}, {s['seq_len']} tokens per sequence, "
            "best of the timed runs:", "", *table]
    return Finding("speed", "Decoder sampling with a KV cache vs encoder-style sampling",
                   "The decoder's KV-cache sampler costs nearly the same at any number of steps, "
                   "while an encoder-style sampler's time grows with the steps (Fig. 4).",
                   speed_comparisons(rows), body, noise_name="timing noise")


def _ensemble_sizes(r: SuiteResults) -> list[int]:
    first = next(iter(r.ensembles.values()), None)
    return [int(m) for m in first["ensemble"]["by_members"]] if first else []


# ---- tables and figures ------------------------------------------------------------------------


def arm_table(r: SuiteResults, arms: tuple[str, ...]) -> list[str]:
    rows = ["", "| run | final training loss | mean training loss (AUC) | held-out l2r nll | "
                "held-out any-order nll |", "|---|---:|---:|---:|---:|"]
    for name, run in r.runs.items():
        if run["arm"] in arms:
            rows.append(f"| {name} | {_num(r.curve(name, 'final'))} | {_num(r.curve(name, 'auc'))} "
                        f"| {_num(r.eval_nll(name, LEFT_TO_RIGHT.word))} "
                        f"| {_num(r.eval_nll(name, ANY_ORDER.word))} |")
    if r.unigram_nll is not None:
        rows.append(f"| unigram reference (token frequencies, no context) | | | "
                    f"{_num(r.unigram_nll)} | {_num(r.unigram_nll)} |")
    return rows


def unigram_gaps(r: SuiteResults, arms: tuple[str, ...]) -> list[tuple[str, float, float]]:
    """(run, left-to-right gap, any-order gap) of the evaluated runs of these arms: their
    held-out NLL minus the unigram reference's (positive: worse than ignoring the context)."""
    if r.unigram_nll is None:
        return []
    gaps = []
    for name, run in r.runs.items():
        l2r, random = r.eval_nll(name, LEFT_TO_RIGHT.word), r.eval_nll(name, ANY_ORDER.word)
        if run["arm"] in arms and l2r is not None and random is not None:
            gaps.append((name, l2r - r.unigram_nll, random - r.unigram_nll))
    return gaps


def against_unigram(r: SuiteResults, arms: tuple[str, ...]) -> list[str]:
    """Each run's held-out any-order NLL against the context-free reference, in words (for arms
    trained in random orders): a claim about what orders do to a model's use of its context can
    only show once the model uses it."""
    parts = [f"{name} {abs(gap):.4f} nats {'above' if gap > 0 else 'below'}"
             for name, _, gap in unigram_gaps(r, arms)]
    if not parts:
        return []
    return ["", "Held-out any-order NLL against the unigram reference: " + ", ".join(parts) +
            " (above it, a run does not yet beat a model that ignores its context)."]


def context_free_runs(r: SuiteResults, arms: tuple[str, ...]) -> list[tuple[str, float, float]]:
    """The runs of unigram_gaps above the reference in both readings: models that do not use
    their context yet."""
    return [gaps for gaps in unigram_gaps(r, arms) if min(gaps[1:]) > 0]


def on_plateau(r: SuiteResults, comparisons: list[Comparison],
               arms_of: Callable[[Comparison], tuple[str, ...]] = lambda c: (
                   c.lower_name, c.higher_name)) -> list[Comparison]:
    """Marks the comparisons whose arms (every evaluated run of each) are all on the plateau."""
    all_arms = tuple({run["arm"] for run in r.runs.values()})
    idle = {name for name, _, _ in context_free_runs(r, all_arms)}
    idle_arms = {arm for arm in all_arms
                 if all(name in idle for name, run in r.runs.items() if run["arm"] == arm)}
    for comparison in comparisons:
        comparison.context_free = all(arm in idle_arms for arm in arms_of(comparison))
    return comparisons


def why_undecided(runs: list[tuple[str, float, float]]) -> list[str]:
    if not runs:
        return []
    gaps = ", ".join(f"{name} {l2r:+.4f} / {random:+.4f}" for name, l2r, random in runs)
    return [f"Why it is undecided here: held out, {len(runs)} of its runs score worse than the "
            "unigram reference (a model that ignores its context) both left to right and in "
            f"random orders (nats above it, left to right / any order: {gaps}). At this budget "
            "they have not begun to use their context, and the claim is about how they use it.",
            ""]


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def save_figure(figure, path: Path) -> None:
    write_atomic(path, lambda partial: figure.savefig(partial, format="png", dpi=110))
    plt.close(figure)


def finish(figure, axes, path: Path) -> None:
    """Grid and legend on every panel, then the figure saved to `path`."""
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    save_figure(figure, path)


def _arm_runs(r: SuiteResults, arms: tuple[str, ...]) -> list[tuple[str, dict, int]]:
    """(run name, run, colour index) of the runs of these arms that have metrics."""
    return [(name, run, arms.index(run["arm"])) for name, run in r.runs.items()
            if run["arm"] in arms and r.records.get(name)]


def plot_training(r: SuiteResults, arms: tuple[str, ...], filename: str, title: str) -> list[str]:
    """The training loss (each arm in its own orders): all steps, and the second half zoomed."""
    runs = _arm_runs(r, arms)
    if not runs:
        return []
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    zoom_values, last_step = [], max(r.records[name][-1]["step"] for name, _, _ in runs)
    for name, run, colour in runs:
        xs, ys = curve(r.records[name], "loss", "step", SMOOTH)
        style = "-" if run["seed"] == r.suite["seeds"][0] else "--"
        for axis in axes:
            axis.plot(xs, ys, style, color=colours[colour], label=f"{name}")
        zoom_values += [y for x, y in zip(xs, ys, strict=True) if x >= last_step / 2]
    axes[1].set_xlim(left=last_step / 2)
    if zoom_values:
        pad = 0.05 * (max(zoom_values) - min(zoom_values) or 1.0)
        axes[1].set_ylim(min(zoom_values) - pad, max(zoom_values) + pad)
    for axis, subtitle in zip(axes, ("all steps", "second half"), strict=True):
        axis.set(title=f"{title}: {subtitle}", xlabel="step",
                 ylabel="training loss, own orders (nats/token)")
    finish(figure, axes, r.out / filename)
    return [f"![{title}]({filename})", "",
            f"Training loss smoothed (EMA {SMOOTH}); solid: seed {r.suite['seeds'][0]}, "
            "dashed: other seeds."]


def plot_validation(r: SuiteResults, arms: tuple[str, ...], filename: str) -> list[str]:
    runs = _arm_runs(r, arms)
    if not runs:
        return []
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for axis, key, label in zip(axes, (loss_key(LEFT_TO_RIGHT, validation=True),
                                       loss_key(ANY_ORDER, validation=True)),
                                ("left-to-right", "any-order"), strict=True):
        for name, run, colour in runs:
            xs, ys = curve(r.records[name], key, "step", 0.0)
            style = "-o" if run["seed"] == r.suite["seeds"][0] else "--s"
            axis.plot(xs, ys, style, color=colours[colour], markersize=3, label=name)
        axis.set(title=f"validation {label} loss during training", xlabel="step",
                 ylabel="nats/token (EMA weights)")
    finish(figure, axes, r.out / filename)
    return [f"![validation losses]({filename})", "",
            "In-training validation (EMA weights, a few batches); the verdict uses the final "
            "held-out evaluation in the table below."]


def plot_floor(r: SuiteResults, arms: tuple[str, ...], entropy: float, threshold: float,
               filename: str) -> list[str]:
    """The in-training validation loss in any order against tokens, with the entropy and the
    threshold: the race of finding F."""
    runs = _arm_runs(r, arms)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figure, axis = plt.subplots(figsize=(8, 5))
    for name, run, colour in runs:
        xs, ys = curve(r.records[name], loss_key(ANY_ORDER, validation=True), "tokens", 0.0)
        style = "-" if run["seed"] == r.suite["seeds"][0] else "--"
        axis.plot(xs, ys, style, color=colours[colour], label=name)
    axis.axhline(entropy, color="black", linewidth=1, label=f"entropy {entropy:.4f}")
    axis.axhline(threshold, color="grey", linestyle=":", label=f"+{FLOOR_MARGIN:.0%}")
    axis.set_ylim(entropy - 0.05, threshold + 0.5)
    axis.set(title="Validation loss in any order against the entropy", xlabel="tokens",
             ylabel="nats/token (EMA weights)")
    finish(figure, [axis], r.out / filename)
    return [f"![race to the entropy]({filename})", "",
            f"Solid: seed {r.suite['seeds'][0]}, dashed: other seeds."]


def plot_ensemble(r: SuiteResults, filename: str) -> list[str]:
    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    for name, result in r.ensembles.items():
        by_members = result["ensemble"]["by_members"]
        sizes = [int(m) for m in by_members]
        axis.errorbar(sizes, [s["ppl"] for s in by_members.values()],
                      yerr=[s["ppl"] * s["nll_se"] for s in by_members.values()],
                      marker="o", capsize=3, label=name)
    axis.set_xscale("log", base=2)
    axis.set_xticks(_ensemble_sizes(r), [str(m) for m in _ensemble_sizes(r)])
    axis.set(title="Finding 5: context-order ensemble", xlabel="ensemble size M",
             ylabel="perplexity (upper bound)")
    finish(figure, [axis], r.out / filename)
    return [f"![ensemble perplexity]({filename})", ""]


def plot_speed(r: SuiteResults, filename: str) -> list[str]:
    rows = r.speed["results"]
    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    steps = [row["steps"] for row in rows]
    axis.plot(steps, [row["decoder_s"] for row in rows], "-o", label="decoder, KV cache (AO-GPT)")
    axis.plot(steps, [row["encoder_s"] for row in rows], "-s",
              label="encoder-style (full forwards)")
    axis.set_ylim(bottom=0)
    axis.set(title="Sampling time vs steps", xlabel="sampling steps", ylabel="seconds per batch")
    finish(figure, [axis], r.out / filename)
    return [f"![sampling time]({filename})", ""]


# ---- the document ------------------------------------------------------------------------------


def render(r: SuiteResults, findings: list[Finding]) -> str:
    s = r.suite
    lines = [f"# AO-GPT findings at small scale ({s['scale']})", "",
             f"`python experiments/run.py --suite findings --scale {s['scale']}`: "
             f"{len(r.runs)} runs of {s['steps_text']} on {s['data']['description']}. "
             f"Code {s['git_commit'] or 'outside git'}; {s['hardware']['summary']}.", "",
             "| finding | claim | verdict |", "|---|---|---|"]
    lines += [f"| {f.key} | {f.title} | **{f.verdict}** |" for f in findings]
    lines += ["", "A difference counts only when it exceeds the noise: the spread (max - min) over "
              "seeds of the arms compared, or for arms trained with one seed the largest spread of "
              f"the arms with several (seeds {', '.join(map(str, s['seeds']))}). Values with "
              "several seeds read `mean (seed 1, seed 2)`."]
    for f in findings:
        lines += ["", f"## Finding {f.key}: {f.title}" if f.key.isdigit() else f"## {f.title}", ""]
        if f.claim:
            lines += [f"Claim: {f.claim}", "", f"Verdict: **{f.verdict}**", ""]
            lines += [f"- {c.describe()}" for c in f.comparisons]
            lines.append("")
            if f.verdict == UNDECIDED_HERE:
                lines += why_undecided(context_free_runs(r, f.arms))
        lines += f.body
    lines += ["", *runs_section(r)]
    return "\n".join(lines) + "\n"


def runs_section(r: SuiteResults) -> list[str]:
    s = r.suite
    lines = ["## Runs", "",
             "| run | arm | seed | steps | tokens | wall time | tokens/s | final loss | status |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, run in r.runs.items():
        wall = run.get("wall_s")
        tokens = run["max_steps"] * run["tokens_per_step"]
        rate = f"{tokens / wall:,.0f}" if wall and run.get("done") else "–"
        lines.append(f"| {name} | {run['label']} | {run['seed']} | {run['max_steps']:,} | "
                     f"{tokens:,} | {_duration(wall)} | {rate} | {_num(r.curve(name, 'final'))} | "
                     f"{'done' if run.get('done') else 'not finished'} |")
    lines += ["", "## Settings", "",
              f"- Base config: `{s['base_config']}`; each run adds its arm's values "
              "(experiments/configs/arms/), its seed, out_dir and data path:"]
    lines += [f"  - `{name}`: `{' '.join(run['overrides'])}`" for name, run in r.runs.items()]
    lines += [f"- Evaluation: `{s['eval_command']}`",
              f"- Ensemble: `{s['ensemble_command']}`",
              f"- Sampling speed: `{s['speed_command']}`",
              f"- Data: {s['data']['description']} (`{s['data']['path']}`)",
              f"- Hardware: {s['hardware']['summary']}; software: {s['software']}",
              f"- Code: git {s['git_commit']}; suite wall time {_duration(s.get('wall_s'))}",
              "- Resolved config of each run: its out_dir/config.yaml; everything above is also in "
              "suite.json."]
    return lines


def _duration(seconds: float | None) -> str:
    if not seconds:
        return "–"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def write_report(out: Path) -> tuple[Path, list[Finding]]:
    """Writes out/report.md (atomically) and its figures; returns its path and the findings."""
    results = load_results(out)
    findings = [finding_1(results), finding_2(results), finding_3(results), finding_5(results),
                finding_curriculum(results), finding_floor(results), finding_speed(results)]
    report = out / "report.md"
    write_text_atomic(report, render(results, findings))
    return report, findings
