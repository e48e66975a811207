"""The report's verdicts: a difference counts only beyond the seed spread; synthetic runs end to
end."""

import json
import math

import findings_testing  # noqa: F401  (puts experiments/ on the import path)
import pytest
from report import (
    AS_CLAIMED,
    NOT_REPRODUCED,
    OPPOSITE,
    REPRODUCED,
    WITHIN_NOISE,
    curve_summary,
    falls_with_size,
    noise_for,
    outcome,
    speed_comparisons,
    verdict,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_a_difference_beyond_the_seed_spread_holds_or_contradicts_the_claim():
    assert outcome(lower=[4.0, 4.1], higher=[4.5, 4.6], noise=0.1) == AS_CLAIMED
    assert outcome(lower=[4.5, 4.6], higher=[4.0, 4.1], noise=0.1) == OPPOSITE


def test_a_difference_within_the_seed_spread_is_noise():
    assert outcome(lower=[4.0, 4.2], higher=[4.1, 4.25], noise=0.2) == WITHIN_NOISE


def test_verdict_needs_every_comparison_as_claimed():
    assert verdict([AS_CLAIMED, AS_CLAIMED]) == REPRODUCED
    assert verdict([AS_CLAIMED, OPPOSITE, WITHIN_NOISE]) == NOT_REPRODUCED
    assert verdict([AS_CLAIMED, WITHIN_NOISE]) == "inconclusive (within seed noise)"
    assert verdict([]) == "not run"


def test_arms_with_one_seed_borrow_the_largest_spread_of_the_others():
    values = {"l2r": [4.0, 4.05], "uniform": [5.0, 5.2], "fixed_random": [6.0], "blockwise8": [5.5]}
    assert noise_for(values, ("l2r", "blockwise8")) == (pytest.approx(0.05), "seed spread of l2r")
    noise, source = noise_for(values, ("blockwise8", "fixed_random"))
    assert noise == pytest.approx(0.2) and "l2r, uniform" in source
    assert noise_for({"a": [1.0], "b": [2.0]}, ("a", "b"))[0] == 0.0


def test_final_loss_is_the_mean_of_the_last_tenth_and_auc_the_mean_height():
    records = [{"step": s, "loss": 10.0 - s / 10} for s in range(1, 101)]
    records.insert(5, {"step": 6, "loss": None})  # a step with no such samples is skipped
    summary = curve_summary(records)
    assert summary["final"] == pytest.approx(10.0 - 95.5 / 10)  # steps 91..100
    assert summary["auc"] == pytest.approx(10.0 - 50.5 / 10)  # a line: its mean height
    assert curve_summary([{"step": 1, "loss_l2r": None}], "loss_l2r") is None


def test_ensemble_falls_with_size_unless_a_size_rises_beyond_the_noise():
    falling = {1337: {1: 4.0, 2: 3.9, 4: 3.85, 8: 3.84, 16: 3.845},
               1338: {1: 4.1, 2: 4.0, 4: 3.95, 8: 3.94, 16: 3.94}}
    comparisons = falls_with_size(falling, standard_error=0.01)
    assert [c.outcome for c in comparisons] == [AS_CLAIMED]  # the plateau at 8 -> 16 is fine
    rising = {1337: {1: 4.0, 2: 3.9, 4: 4.2}}
    assert verdict([c.outcome for c in falls_with_size(rising, 0.01)]) == NOT_REPRODUCED


def test_sampling_speed_shape_of_fig4():
    flat_decoder = [{"steps": 16, "decoder_s": 1.0, "encoder_s": 2.0},
                    {"steps": 128, "decoder_s": 1.05, "encoder_s": 16.0}]
    assert verdict([c.outcome for c in speed_comparisons(flat_decoder)]) == REPRODUCED
    both_grow = [{"steps": 16, "decoder_s": 1.0, "encoder_s": 1.0},
                 {"steps": 128, "decoder_s": 8.0, "encoder_s": 8.2}]
    assert verdict([c.outcome for c in speed_comparisons(both_grow)], "timing noise") == (
        "inconclusive (within timing noise)")


# ---- the report from synthetic metric files ------------------------------------------------------


def write_suite(out, arm_offsets: dict[str, list[float]], steps: int = 200,
                entropy: float | None = None):
    """A suite folder as run.py leaves it: one run per (arm, seed) whose training loss is
    offset + 4 / sqrt(step), validated every 10 steps at offset + 2 / sqrt(step), and suite.json
    (with the data's entropy, if given)."""
    runs = {}
    for arm, offsets in arm_offsets.items():
        for seed, offset in zip((1337, 1338), offsets, strict=False):
            name = f"{arm}-s{seed}"
            run_dir = out / "runs" / name
            run_dir.mkdir(parents=True)
            lines = [json.dumps({"step": s, "tokens_seen": 1024 * s,
                                 "loss": offset + 4 / math.sqrt(s),
                                 **({"val_loss_ao": offset + 2 / math.sqrt(s)} if s % 10 == 0
                                    else {})}) for s in range(1, steps + 1)]
            (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
            runs[name] = {"arm": arm, "label": arm, "seed": seed, "out_dir": str(run_dir),
                          "overrides": [f"train.seed={seed}"], "max_steps": steps,
                          "tokens_per_step": 1024, "done": True, "wall_s": 60.0}
    suite = {"suite": "findings", "scale": "cpu", "seeds": [1337, 1338], "runs": runs,
             "steps_text": f"{steps} steps", "git_commit": "abc123",
             "hardware": {"summary": "a CPU"}, "software": "python", "wall_s": 600.0,
             "data": {"path": "data", "description": "text", "entropy": entropy},
             "base_config": "base_cpu.yaml",
             "eval_command": "evaluate", "ensemble_command": "ensemble", "speed_command": "speed"}
    (out / "suite.json").write_text(json.dumps(suite))


def write_evals(out, held_out: dict[str, tuple[float, float]], unigram: float):
    """evaluate.py's JSON for seeds 1337 and 1338 of each arm: (l2r, random) nll, the second seed
    0.01 higher, and the unigram reference on the same samples."""
    (out / "evals").mkdir()
    for arm, (l2r, random) in held_out.items():
        for seed, jitter in ((1337, 0.0), (1338, 0.01)):
            result = {"l2r": {"nll": l2r + jitter}, "random": {"nll": random + jitter},
                      "unigram": {"nll": unigram}}
            (out / "evals" / f"{arm}-s{seed}.json").write_text(json.dumps({"results": [result]}))


def test_report_reproduces_finding_1_when_the_gap_exceeds_the_seed_spread(tmp_path):
    write_suite(tmp_path, {"l2r": [3.0, 3.02], "uniform": [3.5, 3.53]})
    report, findings = write_report(tmp_path)
    by_key = {f.key: f for f in findings}
    assert by_key["1"].verdict == REPRODUCED
    assert by_key["2"].verdict == "not run" and by_key["5"].verdict == "not run"
    text = report.read_text()
    assert "| 1 | AO-GPT converges slower than the same decoder trained left to right | " \
           "**reproduced** |" in text
    assert "difference +0.5050 > 0.0300 (seed spread of l2r, uniform)" in text
    assert (tmp_path / "finding1.png").read_bytes().startswith(PNG_MAGIC)
    assert not list(tmp_path.glob(".*partial*"))


def test_report_is_inconclusive_when_the_gap_is_within_the_seed_spread(tmp_path):
    write_suite(tmp_path, {"l2r": [3.0, 3.2], "uniform": [3.05, 3.25]})
    _, findings = write_report(tmp_path)
    assert findings[0].verdict == "inconclusive (within seed noise)"


def test_finding_2_orders_fixed_orders_with_the_pooled_spread(tmp_path):
    write_suite(tmp_path, {"l2r": [3.0, 3.01], "blockwise8": [3.2], "blockwise32": [3.3],
                           "fixed_random": [3.6]})
    _, findings = write_report(tmp_path)
    finding_2 = findings[1]
    assert finding_2.verdict == REPRODUCED
    assert len(finding_2.comparisons) == 8  # 4 pairs x (final, AUC)
    assert all("l2r" in c.noise_source for c in finding_2.comparisons)


def test_the_curriculum_is_compared_with_the_papers_constant_10_percent_on_held_out_loss(tmp_path):
    write_suite(tmp_path, {"mixture10": [3.4, 3.42], "curriculum": [3.2, 3.21]})
    held_out = {"mixture10": (5.0, 6.50), "curriculum": (4.0, 6.30)}  # (l2r, random) nll
    write_evals(tmp_path, held_out, unigram=6.4)
    report, findings = write_report(tmp_path)
    curriculum = {f.key: f for f in findings}["C"]
    assert curriculum.verdict == REPRODUCED and len(curriculum.comparisons) == 2
    assert "| C | Beyond the paper: a left-to-right curriculum against the constant 10% | " \
           "**reproduced** |" in report.read_text()
    assert ("Held-out any-order NLL against the unigram reference: mixture10-s1337 0.1000 nats "
            "above, mixture10-s1338 0.1100 nats above, curriculum-s1337 0.1000 nats below, "
            "curriculum-s1338 0.0900 nats below") in report.read_text()


def test_an_undecided_finding_names_its_runs_that_do_not_use_their_context_yet(tmp_path):
    write_suite(tmp_path, {"l2r": [3.0, 3.01], "uniform": [3.5, 3.52], "mixture10": [3.5, 3.51]})
    held_out = {"l2r": (5.0, 8.3), "uniform": (6.65, 6.66), "mixture10": (6.64, 6.655)}
    write_evals(tmp_path, held_out, unigram=6.6)
    report, findings = write_report(tmp_path)
    by_key = {f.key: f for f in findings}
    assert by_key["3"].verdict == "inconclusive (not yet using context)"
    assert by_key["1"].verdict == REPRODUCED
    # whatever the gap, it is one between two models that do not use their context yet
    assert [c.outcome for c in by_key["3"].comparisons] == ["both on the unigram plateau"] * 2
    text = report.read_text()
    assert ("Why it is undecided here: held out, 4 of its runs score worse than the unigram "
            "reference (a model that ignores its context) both left to right and in random "
            "orders (nats above it, left to right / any order: uniform-s1337 +0.0500 / +0.0600, "
            "uniform-s1338 +0.0600 / +0.0700, mixture10-s1337 +0.0400 / +0.0550, "
            "mixture10-s1338 +0.0500 / +0.0650).") in text
    assert text.count("Why it is undecided here") == 1  # Finding 1 is decided; l2r uses context


def test_finding_f_times_the_recipes_to_the_entropy_and_compares_the_best_with_uniform(tmp_path):
    """Entropy 1.0, threshold 1.05: planner's seeds (offsets 0.85, 0.86) reach it at steps 100
    and 120 (validations every 10 steps), bell's (0.9) at 180; uniform's (0.95, 0.96) never in
    200 steps, so their value is a lower bound, 200 steps' tokens."""
    write_suite(tmp_path, {"uniform": [0.95, 0.96], "planner": [0.85, 0.86], "bell": [0.9, 0.9]},
                entropy=1.0)
    report, findings = write_report(tmp_path)
    floor = {f.key: f for f in findings}["F"]
    assert floor.verdict == REPRODUCED
    (comparison,) = floor.comparisons
    assert (comparison.lower_name, comparison.higher_name) == ("planner", "uniform")
    assert comparison.lower == [0.1024, 0.12288] and comparison.higher == [0.2048, 0.2048]
    text = report.read_text()
    assert "Not reached by uniform-s1337, uniform-s1338" in text
    assert "| planner-s1337 | 102,400 |" in text and "| uniform-s1337 | >= 204,800 |" in text
    assert (tmp_path / "floor.png").read_bytes().startswith(PNG_MAGIC)


def test_finding_f_is_not_run_where_the_entropy_is_not_known(tmp_path):
    write_suite(tmp_path, {"uniform": [0.95, 0.96], "planner": [0.85, 0.86]})
    _, findings = write_report(tmp_path)
    floor = {f.key: f for f in findings}["F"]
    assert floor.verdict == "not run" and "--corpus synthetic" in floor.body[0]
