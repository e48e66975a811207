"""The GPU report's markdown (benchmarks/gpu_report.py), made from its JSON: the goals, the call's
items and their seconds, then each item's table."""

from __future__ import annotations

import json

from gpu_report_plan import LEVER_CHANGES, MEASURED_SLOWER, PARTS, describe, train_grid
from gpu_report_run import ACCUMULATION, REPO, SETTING, percent, setting_of
from race_table import table as race_table

GOALS = {"small": 0.45, "medium": 0.50}  # MFU on one H100 (llm-foundry reaches 43-50% on A100)
GENERATION_GOAL = 65.0  # encoder / decoder time at S = n = 1024 (Eso-LMs' claim over MDMs)
DECODE_GOAL_MS = 0.45  # per decoder call, small, batch 32, n = 1024: >= 60% of an H100's HBM


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _default_row(report: dict, preset: str) -> dict | None:
    """The measured row of the default recipe for a preset (train_grid's first two)."""
    default = train_grid(False)[0 if preset == "small" else 1]
    for row in report.get("train", []):
        if all(setting_of(row, k) == default[k] for k in SETTING) and "error" not in row:
            return row
    return None


def _as_sample_py(report: dict) -> dict | None:
    """decode_step's fastest row of a step as trainer/sample.py runs it on a GPU (graphs, and
    compiled too for long runs), without a fall-back to eager."""
    rows = [r for r in report.get("decode", {}).get("results", [])
            if r.get("as_sample_py") and r.get("cuda_graphs") and not r.get("fell_back")]
    return min(rows, key=lambda r: r["step_ms"], default=None)


def goals(report: dict) -> list[str]:
    """The goals table: measured value, ratio to the goal, ratio to the paper's code (like with
    like: bare training steps against bare steps, generation alone against generation alone)."""
    best = report.get("paper", {}).get("train_best")
    lines = ["## Goals", "", "| goal | measured | measured / goal | ours / the paper's code |",
             "|---|---|---|---|"]
    for preset, goal in GOALS.items():
        row = _default_row(report, preset)
        if row is None or row.get("mfu") is None:
            lines.append(f"| {preset}: MFU >= {goal:.0%} | not measured | | |")
            continue
        versus = (f"{best['ratio']:.2f}x tokens/s (bare training steps, each side's fastest)"
                  if preset == "small" and best else "")
        lines.append(f"| {preset}: MFU >= {goal:.0%} | {row['mfu']:.1%} "
                     f"({row['tokens_per_s']:,.0f} tokens/s) | {row['mfu'] / goal:.2f} | "
                     f"{versus} |")
    lines += [decode_goal_line(report), "",
              "measured / goal above 1 meets the goal (for the decode call: goal / measured)."]
    return lines + [""]


def decode_goal_line(report: dict) -> str:
    """The decode call's row of the goals table, against the paper's sampler at S = n."""
    paper = report.get("paper", {})
    at_n = next((r for r in paper.get("generation", []) if r["steps"] == 1024), None)
    versus = (f"{at_n['ratio_generate']:.2f}x faster generation (S = 1024, compilation apart)"
              if at_n else "")
    step, decode = _as_sample_py(report), report.get("decode", {})
    if step is None:
        return f"| decode: <= {DECODE_GOAL_MS} ms per call | not measured | | {versus} |"
    return (f"| decode: <= {DECODE_GOAL_MS} ms per call (small, batch {decode['batch_size']}, "
            f"n = {decode['seq_len']}) | {step['step_ms']:.3f} ms ({step['name']}, "
            f"{step['kernels']} kernels) | {DECODE_GOAL_MS / step['step_ms']:.2f} | {versus} |")


def header_lines(report: dict) -> list[str]:
    """The title, the machine and code, and how the report was made (notes, what was left)."""
    env = report["environment"]
    smoke = " (smoke run: tiny sizes, not a measurement)" if report["smoke"] else ""
    lines = [f"# GPU report{smoke}",
             "",
             f"{env['device']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
             f"Python {env['python']}, {env['date']}, commit {env['git']}. Made by "
             "`make gpu-report` (benchmarks/gpu_report.py: its docstring says what each item "
             "runs) in one call"
             + (f" of {report['seconds']:.0f} s." if "seconds" in report else " (under way)."), ""]
    for note in report.get("notes", []):  # how a report put together from several runs was made
        lines += [f"Note: {note}", ""]
    for what in ("left", "skipped"):
        for entry in report.get(what, []):
            lines += [f"{'Left for a second call' if what == 'left' else 'Skipped'}: {entry}", ""]
    return lines


SECTIONS = (  # part, title, lines of its body
    ("decode", "One decoder step (`decode_step.py`)", lambda d: decode_lines(d)),
    ("paper", "The paper's code beside ours (`paper_baseline.py`)", lambda p: paper_lines(p)),
    ("generation", "Generation: KV-cache decoder vs the encoder baseline",
     lambda g: generation_lines(g)),
    ("race", "The sampling race: exact left-to-right samples against a GPT (`sampling_race.py`)",
     lambda r: race_lines(r)))


def markdown(report: dict) -> str:
    """The whole report, from its JSON."""
    lines = header_lines(report) + goals(report)
    if report.get("plan"):
        lines += call_lines(report)
    if "checks" in report:
        lines += checks_lines(report["checks"])
    lines += anatomy_lines(report)
    if "train" in report:
        lines += train_lines(report["train"]) + lever_lines(report)
    for part, title, body in SECTIONS:
        if part in report:
            error = report[part].get("error")
            lines += [f"## {title}", "", *([f"failed: {error}", ""] if error else []),
                      *body(report[part])]
    if "e2e" in report:
        lines += e2e_lines(report["e2e"])
    return "\n".join(lines)


# each anatomy the report sets its profile beside: its JSON, and the measured row that matches it
ANATOMIES = {"small's training step": ("step-anatomy.json",
                                       lambda r: _default_row(r, "small")),
             "medium's training step": ("step-anatomy-medium.json",
                                        lambda r: _default_row(r, "medium")),
             "decode call": ("step-anatomy-decode.json", _as_sample_py)}


def anatomy_lines(report: dict) -> list[str]:
    """Where the time goes, per kernel class: the anatomy's prediction for this GPU (the
    committed docs/step-anatomy*.json, counted on a CPU by benchmarks/step_anatomy.py) beside
    what the profiler measured here (small's and medium's default steps, the decode call as
    sample.py runs it)."""
    lines = []
    for what, (name, row_of) in ANATOMIES.items():
        anatomy, row = _anatomy(name, report["environment"]["device"]), row_of(report)
        if anatomy and row and row.get("classes"):
            lines += class_table(what, anatomy, row["classes"]) + busy_lines(row)
    return (["## Where the time goes: the anatomy's prediction and the profiler's measurement",
             ""] + lines) if lines else []


def _anatomy(name: str, device: str) -> dict | None:
    """The committed anatomy's prediction per class on this GPU (None for another GPU)."""
    path = REPO / "docs" / name
    data = json.loads(path.read_text()) if path.is_file() else {}
    return next((classes for gpu, classes in data.get("by_gpu", {}).items() if gpu in device),
                None)


def class_table(what: str, predicted: dict, measured: dict) -> list[str]:
    """One anatomy's classes: kernels and milliseconds predicted and measured."""
    lines = [f"{what} (ms per {'optimizer step' if 'step' in what else 'call'}):", "",
             "| class | kernels predicted | kernels measured | ms predicted | ms measured | "
             "measured / predicted |", "|---|---|---|---|---|---|"]
    for name, row in predicted.items():
        got = measured.get(name, {"kernels": 0, "measured_s": 0.0})
        ratio = (f"{got['measured_s'] / row['predicted_s']:.2f}" if row["predicted_s"] else "")
        lines.append(f"| {name} | {row['kernels']} | {got['kernels']:.0f} | "
                     f"{row['predicted_s'] * 1e3:.3f} | {got['measured_s'] * 1e3:.3f} | {ratio} |")
    return lines + [""] + costliest_lines(predicted, measured)


def busy_lines(row: dict) -> list[str]:
    """How much of the measured step (or call) the profiled kernels fill: the rest the GPU waits
    on the host (launches, Python) or the data, which no kernel's speed-up recovers."""
    step_s = row.get("step_s") or row.get("step_ms", 0) / 1e3
    kernels_s = sum(c["measured_s"] for c in row["classes"].values())
    if not step_s:
        return []
    ms = lambda s: f"{s * 1e3:.1f}" if s >= 0.01 else f"{s * 1e3:.3f}"  # noqa: E731
    return [f"The profiled kernels take {ms(kernels_s)} ms of the {ms(step_s)} ms "
            f"measured: the GPU is busy {min(1.0, kernels_s / step_s):.0%} of the time, and waits "
            "on the host or the data for the rest.", ""]


def costliest_lines(predicted: dict, measured: dict) -> list[str]:
    """The costliest kernels the profiler named in each class that took over 1.25 times its
    prediction: what the anatomy does not yet model."""
    lines = []
    for name, row in predicted.items():
        got = measured.get(name, {})
        if got.get("top") and got["measured_s"] > 1.25 * row["predicted_s"]:
            lines.append(f"- {name}: " + "; ".join(
                f"{kernel[:70]} ({count:.0f} x, {seconds * 1e3:.2f} ms)"
                for kernel, count, seconds in got["top"]))
    return lines + [""] if lines else []


def call_lines(report: dict) -> list[str]:
    """The plan as it ran: each item's estimate beside the seconds it took (what ESTIMATE_S is
    updated from)."""
    took = report.get("item_seconds", {})
    lines = ["## The call", "", "| item | estimate s | took s |", "|---|---|---|"]
    for item in report["plan"]:
        seconds = took.get(item["item"])
        lines.append(f"| {item['item']} | {item['estimate_s']:.0f} | "
                     f"{'' if seconds is None else f'{seconds:.0f}'} |")
    return lines + [""]


def checks_lines(c: dict) -> list[str]:
    failed = [t for t in c["tests"] if t["outcome"] in ("FAILED", "ERROR")]
    lines = ["## Correctness checks (`pytest -m gpu`, run first)", "",
             f"{c.get('summary', 'under way')}"
             + (f" ({c['seconds']:.0f} s)" if "seconds" in c else "") + ".", ""]
    if c.get("error"):
        lines += [f"failed: {c['error']}", ""]
    reasons = c.get("reasons", {})
    tests = c["tests"] + [{"test": test, "outcome": "ERROR"} for test in reasons
                          if "::" not in test]  # modules that could not be collected
    lines += ["| test | outcome | why |", "|---|---|---|"]
    lines += [f"| {t['test']} | {t['outcome']} | {reasons.get(t['test'], '').replace('|', '/')} |"
              for t in tests]
    return lines + ([""] if not failed else ["", f"{len(failed)} failed: see the rows above.", ""])


def train_lines(rows: list[dict]) -> list[str]:
    lines = [f"## Training throughput (one GPU, seq 1024, {16 * ACCUMULATION} sequences per "
             "step, the real trainer with EMA)", "",
             "| model | ZeRO | precision | compiled | scope | attention | micro | workers | "
             "lever | tokens/s | MFU | goal | MFU / goal | peak memory GiB | step s | "
             "loader / step |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        goal = GOALS.get(r["preset"])
        settings = (f"| {r['preset']} | {r['zero']} | {r['precision']} | {r['compile']} | "
                    f"{r.get('scope', 'block')} | {r.get('attention', r['attn'])} | "
                    f"{r.get('micro', r.get('micro_batch_size', 16))} | {r.get('workers', 2)} | "
                    f"{r.get('lever') or 'none'} |")
        if "error" in r:
            lines.append(f"{settings} failed: {r['error']} | | | | | | |")
            continue
        ratio = f"{r['mfu'] / goal:.2f}" if goal and r.get("mfu") else "n/a"
        memory = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") else "n/a"
        loader = f"{r['loader_ratio']:.1f}x" if r.get("loader_ratio") else "n/a"
        causal = f" ({percent(r['mfu_causal'])})" if r.get("mfu_causal") else ""
        lines.append(f"{settings} {r['tokens_per_s']:,.0f} | {percent(r.get('mfu'))}{causal} | "
                     f"{percent(goal)} | {ratio} | {memory} | {r['step_s']:.3f} | {loader} |")
    return lines + ["", "MFU counts 6N + 12 L d T FLOPs per token (N without the embedding "
                    "lookups) against the device's dense bf16 peak; in brackets, with causal "
                    "attention halved (6N + 6 L d T, Megatron's and MaxText's count). lever: a "
                    "speed lever of trainer/speed.py (docs/performance.md). loader / step: the "
                    "loader alone against what a step consumes (>= 10x needed).", ""]


def against_default(report: dict) -> list[tuple[str, float]]:
    """Each measured lever row's tokens/s over its preset's default recipe's (measured in the
    same report), fastest first: what a lever gains, the number that makes it a default."""
    ratios, levers = [], LEVER_CHANGES + MEASURED_SLOWER
    base = train_grid(False)[0]
    for row in report.get("train", []):
        default = _default_row(report, row["preset"]) if row["preset"] in GOALS else None
        changed = {k: setting_of(row, k) for k in SETTING[1:] if setting_of(row, k) != base[k]}
        if changed in levers and default and "error" not in row:
            name = describe({k: setting_of(row, k) for k in SETTING}).removeprefix("train ")
            ratios.append((name, row["tokens_per_s"] / default["tokens_per_s"]))
    return sorted(ratios, key=lambda pair: -pair[1])


def lever_lines(report: dict) -> list[str]:
    """The speed levers against the default recipe, one line each: a lever above 1 is a
    candidate for the presets' default (docs/performance.md, "The speed levers")."""
    ratios = against_default(report)
    if not ratios:
        return []
    return (["The speed levers against the default recipe (tokens/s, lever / default; one "
             "measurement each):", ""] + [f"- {name}: {ratio:.3f}x" for name, ratio in ratios]
            + [""])


def decode_lines(d: dict) -> list[str]:
    if not d.get("results"):
        return []
    lines = [f"{d['preset']}, batch {d['batch_size']}, n = {d['seq_len']}, {d['known']} known, "
             f"{d['targets']} drawn, {d['dtype']}; kernels: {d.get('kernels_are', 'operations')} "
             "per step; warm-up: the first call (compilation, capture), never timed.", "",
             "| step | kernels | ms per step | warm-up s | logits vs eager | same tokens |",
             "|---|---|---|---|---|---|"]
    for r in d["results"]:
        name = r.get("name", "compiled" if r["compiled"] else "eager")
        name += f" (trainer/sample.py {r['as_sample_py']})" if r.get("as_sample_py") else ""
        name += " FELL BACK TO EAGER" if r.get("fell_back") else ""
        lines.append(f"| {name} | {r.get('kernels', r.get('operations'))} | {r['step_ms']:.3f} | "
                     f"{r['warm_up_s']:.1f} | {r.get('max_logit_difference', 0):.1e} | "
                     f"{r.get('same_tokens', '')} |")
    return lines + [""]


def paper_lines(p: dict) -> list[str]:
    lines = []
    for part in ("train", "generation"):
        if p.get(f"{part}_error"):
            lines += [f"{part}: failed: {p[f'{part}_error']}", ""]
    return lines + paper_train_lines(p) + paper_generation_lines(p)


def paper_train_lines(p: dict) -> list[str]:
    if not p.get("train"):
        return []
    lines = ["Bare training steps on both sides (random tokens on the device, no loader, no "
             "DeepSpeed: the paper's loop as its train_AOGPT_CL.py runs it, ours with our "
             "network, loss and order sampler), each loop's first step (compilation) apart.", "",
             "| loop | paper tokens/s | ours tokens/s | ours / paper | first step s "
             "(paper / ours) |", "|---|---|---|---|---|"]
    lines += [f"| {'compiled' if r['compiled'] else 'eager'} | {r['paper_tokens_per_s']:,.0f} "
              f"| {r['ours_tokens_per_s']:,.0f} | {r['ratio']:.2f}x | "
              f"{r.get('paper_first_step_s', 0):.1f} / {r.get('ours_first_step_s', 0):.1f} |"
              for r in p["train"]]
    return lines + [""]


def paper_generation_lines(p: dict) -> list[str]:
    if not p.get("generation"):
        return []
    lines = ["Each sampler in a fresh process, generating twice: the first samples come after "
             "its start-up and compilation; generation is the second call alone.", "",
             "| S | samples | paper: generation s / first samples s | ours | paper / ours "
             "(generation / first samples) |", "|---|---|---|---|---|"]
    for r in p["generation"]:
        paper, ours = r["paper"], r["ours"]
        lines.append(f"| {r['steps']} | {r['samples']} | {paper['generate_s']:.2f} / "
                     f"{paper['first_samples_s']:.1f} | {ours['generate_s']:.2f} / "
                     f"{ours['first_samples_s']:.1f} | {r['ratio_generate']:.2f}x / "
                     f"{r['ratio_first_samples']:.2f}x |")
    return lines + [""]


def generation_lines(g: dict) -> list[str]:
    if not g.get("results"):
        return []
    floor = g.get("hbm_floor_ms")
    lines = [f"{g['preset']}, batch {g['batch_size']}, n = {g['seq_len']}, {g['dtype']}, CUDA "
             "graphs on both (on a GPU); warm-up (compilation, capture, one generation) apart"
             + (f"; memory floor of a decoder call {floor:.3f} ms" if floor else "") + ".", "",
             "| steps S | compiled | decoder s | encoder s | ratio | ms per decoder call | goal | "
             "ratio / goal | warm-up s (decoder / encoder) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in g["results"]:
        at_goal = r["steps"] == g["seq_len"]  # the goal is set for S = n
        goal = f"{GENERATION_GOAL:.0f}x" if at_goal else ""
        versus = f"{r['ratio'] / GENERATION_GOAL:.2f}" if at_goal else ""
        ms = r.get("decoder_ms_per_call")
        warm = (f"{r['decoder_warm_up_s']:.1f} / {r['encoder_warm_up_s']:.1f}"
                if "decoder_warm_up_s" in r else "")
        lines.append(f"| {r['steps']} | {r.get('compiled', False)} | {r['decoder_s']:.3f} | "
                     f"{r['encoder_s']:.3f} | {r['ratio']:.1f}x | "
                     f"{'' if ms is None else f'{ms:.3f}'} | {goal} | {versus} | {warm} |")
    return lines + [""]


def race_lines(r: dict) -> list[str]:
    """sampling_race.py's own table of the rows timed so far (its JSON keys the batch sizes as
    text), under a line saying what raced."""
    sizes = r.get("batch_sizes", [])
    rows = [{**row, **{key: {int(size): x for size, x in row[key].items()}
                       for key in ("tokens_per_s", "speedup")}}
            for row in r.get("rows", []) if len(row.get("speedup", {})) == len(sizes)]
    if not rows:
        return []
    entropy = r.get("entropy_rate")
    return [f"{r.get('title', '')}; {r['num_samples']} samples judged"
            + (f", the language's entropy {entropy:.4f} nats per token" if entropy else "")
            + "; each sampler compiled and replayed as CUDA graphs on a GPU, the faster kept "
            "where both ran.", "", race_table(rows, r).rstrip("\n"), ""]


def e2e_lines(e: dict) -> list[str]:
    if "steps" not in e:
        return ["## End to end: `trainer/main.py`, the small recipe", "",
                f"failed: {e['error']}", ""]
    return ["## End to end: `trainer/main.py`, the small recipe", "",
            f"{'OK' if e['ok'] else 'FAILED'}: {e['steps']} steps of {e['tokens_per_step']:,} "
            f"tokens in two launches ({e['first_launch_steps']} steps, then resumed to "
            f"{e['steps']}); loss {_num(e['first_loss'])} at step 1 -> {_num(e['last_loss'])} at "
            f"step {e['last_step']}; checkpoints {', '.join(e['checkpoints'])}; resumed: "
            f"{e['resumed']}; final weights: {e['final_weights']}; "
            f"{sum(e['seconds']):.0f} s in all."
            + (f" Error: {e['error']}" if "error" in e else ""), ""]


def failed_parts(report: dict) -> list[str]:
    return [part for part in PARTS if part in report and (
        (part == "train" and any("error" in r for r in report["train"]))
        or (part == "e2e" and not report["e2e"].get("ok"))
        or (part == "paper" and any(k.endswith("_error") for k in report["paper"]))
        or (part in ("checks", "decode", "generation", "race") and "error" in report[part]))]
