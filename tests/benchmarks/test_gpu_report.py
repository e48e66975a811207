"""benchmarks/gpu_report.py: its plan fits one 10-minute device call with every promised item
(--dry-run, on any machine), a plan that would drop one is refused, an item cut short keeps its
finished rows, and its --smoke run goes through every item on this machine (CI has no GPU),
writing the markdown and JSON. Bad input is one line."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, run_cli

sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_report  # noqa: E402
import gpu_report_plan  # noqa: E402
import gpu_report_render  # noqa: E402
import gpu_report_run  # noqa: E402
import roofline  # noqa: E402
from gpu_report_plan import LEVER_CHANGES, describe, train_grid  # noqa: E402
from results import STOP_VARIABLE  # noqa: E402

STANDIN = REPO / "tests" / "benchmarks" / "paper_standin"
PROMISED = ["checks: pytest -m gpu", "train small (default recipe)", "decode: one step",
            "train medium (default recipe)",
            *(describe({**train_grid(False)[0], **change}) for change in LEVER_CHANGES)]


def plan_of(stdout: str) -> list[tuple[float, float, str]]:
    """(estimate, running total, item) of each planned line of --dry-run's output."""
    return [(float(m[1]), float(m[2]), m[3]) for m in
            re.finditer(r"^ +(\d+) +(\d+)  (.+)$", stdout, flags=re.MULTILINE)]


def test_the_plan_fits_one_device_call_with_the_checks_first_and_every_promised_item():
    result = run_cli("benchmarks/gpu_report.py", "--dry-run")
    assert result.returncode == 0, result.stderr
    planned = plan_of(result.stdout)
    assert planned[-1][1] == sum(s for s, _, _ in planned) <= 560
    names = [name for _, _, name in planned]
    assert names[0].startswith("checks")  # correctness before any measurement
    order = [next(n for n, name in enumerate(names) if name.startswith(p)) for p in PROMISED]
    assert order == sorted(order)  # in order of value
    # what does not fit is named, with the call that measures it (the paper's side is kept from
    # the H200 report by --merge)
    assert "left for a second call (make gpu-report REPORT_FLAGS=--merge" in result.stdout
    for left in ("generation: decoder vs encoder", "e2e: trainer/main.py", "train small (zero 2)",
                 "paper: both trainers"):
        assert left in result.stdout.split("left for a second call")[1]


@pytest.mark.parametrize("args, dropped", [
    (["--budget", "300"], "train medium (default recipe)"),  # the default plan, in too little time
    (["--only", "checks,paper,generation,e2e"], "generation: decoder vs encoder"),  # --only: all
])
def test_a_plan_that_would_drop_a_promised_item_is_refused(run_main, args, dropped):
    code, _, err = run_main(gpu_report.main, "--dry-run", *args)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("error: the plan does not fit --budget") and dropped in line


def test_only_train_measures_the_grid_as_the_budget_allows_and_names_the_rest():
    """The training grid beyond the two default rows is never promised, even with --only: on the
    first H200 run, `--only checks,train` was refused for its eighth grid row, a device call
    lost."""
    result = run_cli("benchmarks/gpu_report.py", "--dry-run", "--only", "checks,train")
    assert result.returncode == 0, result.stderr
    plan, left = result.stdout.split("left for a second call")
    assert "train small (default recipe)" in plan and "train medium (default recipe)" in plan
    assert "train medium (zero 2)" in left


def test_the_make_target_passes_the_papers_checkout_and_runs_without_the_venv_on_a_gpu_machine():
    outer_make = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")  # `make test` runs this test
    env = {key: value for key, value in os.environ.items() if key not in outer_make}
    done = subprocess.run(["make", "--no-print-directory", "-n", "gpu-report", "PY=python3"],
                          cwd=REPO, capture_output=True, text=True, env=env)
    assert done.stdout.splitlines() == ["python3 benchmarks/gpu_report.py --paper .paper "]


def test_a_run_without_the_papers_code_is_refused_before_any_work(tmp_path):
    """The command's one refusal run as a real process, as a user meets it: its other refusals
    run in this process (run_main), without a process's seconds of imports each."""
    out = tmp_path / "r.md"
    result = run_cli("benchmarks/gpu_report.py", "--smoke", "--only", "paper", "--paper",
                     str(tmp_path / "nowhere"), "--out", str(out))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: --paper {tmp_path / 'nowhere'} is not a folder: the paper's")
    assert not out.exists()


def test_a_command_past_its_time_is_ended_and_its_output_kept():
    """What no item may do: run past the budget. Ended with its whole process group."""
    code, output, seconds = gpu_report_run.run(
        [sys.executable, "-c", "import time; print('a row', flush=True); time.sleep(600)"],
        timeout=3)
    assert code == 124 and "a row" in output and "timed out after 3 s" in output
    assert seconds < 60


def test_an_item_cut_short_keeps_the_rows_it_finished(tmp_path):
    """decode_step stopped after its first row, as the budget would stop it: the report holds
    that row, and says the item failed."""
    out = tmp_path / "report.md"
    result = run_cli("benchmarks/gpu_report.py", "--smoke", "--only", "decode", "--out", str(out),
                     env={**os.environ, STOP_VARIABLE: "1"})
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    decode = json.loads(out.with_suffix(".json").read_text())["decode"]
    assert [row["name"] for row in decode["results"]] == ["eager"] and "error" in decode
    assert "| eager (trainer/sample.py on a CPU) |" in out.read_text()


@pytest.mark.slow  # trainer launches, both samplers, the paper's stand-in, pytest: 5-12 min
def test_smoke_report_runs_every_item_and_writes_markdown_and_json(tmp_path):
    """Every part but the race (its own test below, so that the two run side by side)."""
    out = tmp_path / "report.md"
    result = run_cli("benchmarks/gpu_report.py", "--smoke", "--out", str(out),
                     "--paper", str(STANDIN), "--only", ",".join(
                         part for part in gpu_report_plan.PARTS if part != "race"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.with_suffix(".json").read_text())
    assert [item["part"] for item in report["plan"]] == [
        "checks", "data", "train", "decode", "paper", "paper", "generation", "e2e"]
    assert report["skipped"] == [] and report["left"] == []
    (row,) = report["train"]
    assert row["tokens_per_s"] > 0 and row["precision"] == "fp32" and "error" not in row
    e2e = report["e2e"]
    assert e2e["ok"] and e2e["resumed"] and e2e["last_step"] == e2e["steps"]
    assert e2e["last_loss"] < e2e["first_loss"]
    assert [r["steps"] for r in report["generation"]["results"]] == [4, 32]
    assert [r["name"] for r in report["decode"]["results"]] == ["eager", "compiled"]
    assert_paper_rows(report["paper"])
    checks = report["checks"]
    assert checks["exit_code"] == 0 and checks["tests"]
    assert checks["tests"][0]["test"].startswith("tests/model/test_gpu_checks.py")  # first
    if not torch.cuda.is_available():
        assert {t["outcome"] for t in checks["tests"]} == {"SKIPPED"}  # collected, and skip
    text = out.read_text()
    for heading in ("# GPU report (smoke run", "## Goals", "## The call", "## Correctness checks",
                    "## Training throughput", "## End to end", "## Generation",
                    "## One decoder step", "## The paper's code beside ours"):
        assert heading in text


@pytest.mark.slow  # two trainer launches at once, then the race: ~1 min
def test_smoke_race_trains_both_networks_and_races_them_left_to_right(tmp_path):
    """The race item: a tiny synthetic language made, an AO-GPT and a GPT trained on it by
    trainer/main.py, raced by sampling_race.py; the report holds its table."""
    out = tmp_path / "report.md"
    result = run_cli("benchmarks/gpu_report.py", "--smoke", "--only", "race", "--out", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    race = json.loads(out.with_suffix(".json").read_text())["race"]
    assert "error" not in race and race["complete"] and race["exact_judge"]
    labels = [row["label"] for row in race["rows"]]
    assert labels[0] == "GPT, one token per call"
    assert any("speculative" in label for label in labels)
    assert "AO-GPT speculative K=2 R=2" in labels  # the smoke races pre-drafts too
    for row in race["rows"]:
        assert set(row["speedup"]) == {"1", "3"} and 0 < row["calls_per_token"] <= 1
    text = out.read_text()
    assert "## The sampling race" in text and "| GPT, one token per call | 1.000 |" in text


def assert_paper_rows(paper: dict) -> None:
    """benchmarks/paper_baseline.py's smoke rows, both parts, as the report keeps them: each side
    timed in each training mode with the first (compiling) step apart, each side's best against
    the other's, and each sampler's best mode against ours."""
    assert "train_error" not in paper and "generation_error" not in paper  # both complete
    assert [row["compiled"] for row in paper["train"]] == [False, True]
    for row in paper["train"]:
        assert row["paper_tokens_per_s"] > 0 and row["ours_tokens_per_s"] > 0
        assert row["ratio"] == row["ours_tokens_per_s"] / row["paper_tokens_per_s"]
        assert row["paper_first_step_s"] > 0 and row["ours_first_step_s"] > 0  # timed apart
    best = paper["train_best"]  # each side's fastest mode against the other's
    assert best["paper_tokens_per_s"] == max(r["paper_tokens_per_s"] for r in paper["train"])
    assert best["ours_tokens_per_s"] == max(r["ours_tokens_per_s"] for r in paper["train"])
    assert best["ratio"] == best["ours_tokens_per_s"] / best["paper_tokens_per_s"]
    assert [row["steps"] for row in paper["generation"]] == [4, 8]
    for row in paper["generation"]:
        theirs, ours = row["paper"], row["ours"]
        assert theirs in row["paper_modes"] and len(row["paper_modes"]) in (2, 4)
        assert theirs["generate_s"] == min(m["generate_s"] for m in row["paper_modes"])  # its best
        # the first samples come after the process's start-up and a first (compiling) call;
        # generation is a second call, timed alone
        assert ours["first_samples_s"] > ours["generate_s"] > 0
        assert row["ratio_generate"] == theirs["generate_s"] / ours["generate_s"]
        assert row["ratio_first_samples"] == theirs["first_samples_s"] / ours["first_samples_s"]


def test_a_smoke_run_without_out_writes_to_a_temporary_folder_never_to_docs(run_main):
    committed = {name: (REPO / "docs" / name).read_bytes()
                 for name in ("gpu-report.md", "gpu-report.json")}
    # the quickest item (a few seconds: the decode item compiles a step)
    result = run_cli("benchmarks/gpu_report.py", "--smoke", "--only", "generation")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = Path(re.search(r"writing (\S+gpu-report\.md)", result.stdout).group(1))
    assert written.is_file() and REPO not in written.parents
    assert "## Generation: KV-cache decoder vs the encoder baseline" in written.read_text()
    assert {name: (REPO / "docs" / name).read_bytes() for name in committed} == committed
    code, _, err = run_main(gpu_report.main, "--smoke", "--only", "decode", "--out",
                            REPO / "docs" / "gpu-report.md")
    assert code == 2 and "that is the GPU's report" in err


@pytest.mark.parametrize("args, message", [
    (["--smoke", "--only", "train,speed"], "--only: unknown part(s) speed"),
    (["--smoke", "--train-filter", "dtype=bf16"], "--train-filter dtype=bf16: use KEY=VALUE"),
    (["--dry-run", "--train-filter", "lever=cuda_graph"],
     "--train-filter lever=cuda_graph: no training row has it; lever is one of ''"),
])
def test_bad_options_are_one_line_errors(run_main, tmp_path, args, message):
    code, _, err = run_main(gpu_report.main, *args, "--out", tmp_path / "r.md")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), err
    assert not (tmp_path / "r.md").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_only_the_smoke_run_and_the_plan_are_offered(run_main, tmp_path):
    code, _, err = run_main(gpu_report.main, "--out", tmp_path / "r.md")
    assert code == 2
    assert "no CUDA GPU here" in err and "--smoke" in err
    assert "--dry-run" in err


def test_the_report_sets_the_profilers_time_per_class_beside_the_anatomys_prediction():
    """The committed H200 report's default small and medium rows and decode call, given the
    per-class times a profile would add: the markdown holds each class's predicted (the
    committed anatomy's, for this GPU) and measured kernels and milliseconds side by side."""
    report = json.loads((REPO / "docs" / "gpu-report.json").read_text())
    classes = {name: {"kernels": 10, "measured_s": 0.002} for name in roofline.CLASSES}
    for _, row_of in gpu_report_render.ANATOMIES.values():
        row_of(report)["classes"] = classes
    text = gpu_report_render.markdown(report)
    assert "## Where the time goes: the anatomy's prediction and the profiler's measurement" in text
    for what, (name, _) in gpu_report_render.ANATOMIES.items():
        predicted = json.loads((REPO / "docs" / name).read_text())["by_gpu"]["H200"]["matmul"]
        section = text.split(f"{what} (ms")[1].split("\n\n")[1]
        assert (f"| matmul | {predicted['kernels']} | 10 | {predicted['predicted_s'] * 1e3:.3f} "
                f"| 2.000 | {0.002 / predicted['predicted_s']:.2f} |") in section


def test_the_report_sets_each_lever_against_the_default_recipe_fastest_first():
    """Lever rows beside the committed H200 report's default small row: each named by what it
    changes, its tokens/s over the default's, the one that gains first; a failed row is left
    out (it measured nothing)."""
    report = json.loads((REPO / "docs" / "gpu-report.json").read_text())
    default = gpu_report_render._default_row(report, "small")
    report["train"] = [default,  # the committed report's own lever rows left out
        {**default, "lever": "coalesce_grad_reduction", "tokens_per_s": default["tokens_per_s"]},
        {**default, "scope": "network", "tokens_per_s": 1.1 * default["tokens_per_s"]},
        {**default, "micro": 32, "tokens_per_s": 1.05 * default["tokens_per_s"]},
        {**default, "workers": 8, "tokens_per_s": 1.2 * default["tokens_per_s"]},  # no lever
        {**default, "lever": "cuda_graphs", "error": "capture failed"}]
    text = gpu_report_render.markdown(report)
    levers = text.split("The speed levers against the default recipe")[1].split("\n\n")[1]
    assert levers.splitlines() == ["- small (scope network): 1.100x",
                                   "- small (micro 32): 1.050x",
                                   "- small (coalesce_grad_reduction): 1.000x"]


def test_the_report_names_the_costliest_kernels_of_a_class_over_its_prediction_and_the_idle_time():
    """A class measured over 1.25 times its prediction is followed by the kernel names the
    profile kept for it (what the anatomy does not model); one near its prediction is not. The
    kernels' sum against the measured step says how long the GPU waited (host or data)."""
    report = json.loads((REPO / "docs" / "gpu-report.json").read_text())
    predicted = json.loads((REPO / "docs" / "step-anatomy.json").read_text())["by_gpu"]["H200"]
    row = gpu_report_render._default_row(report, "small")
    row["classes"] = {name: {"kernels": 1, "measured_s": c["predicted_s"], "top": [["k", 1, 0]]}
                      for name, c in predicted.items()}
    row["classes"]["other"] = {"kernels": 5, "measured_s": 3 * predicted["other"]["predicted_s"],
                               "top": [["triton_poi_fused_gelu_view_11", 96, 0.00707]]}
    row["step_s"] = 2 * sum(c["measured_s"] for c in row["classes"].values())
    section = gpu_report_render.markdown(report).split("small's training step (ms")[1]
    section = section.split("medium's training step")[0]
    costly = [line for line in section.splitlines() if line.startswith("- ")]
    assert costly == ["- other: triton_poi_fused_gelu_view_11 (96 x, 7.07 ms)"]
    assert "the GPU is busy 50% of the time" in section


def test_a_failed_row_names_the_exception_not_torch_compiles_advice_and_keeps_the_log_tail():
    """The H200's first lever rows were reported by torch.compile's closing hint alone; the row
    now names the exception and keeps the log's last lines to mend it by."""
    output = "\n".join([f"[rank0]:   frame {n}" for n in range(100)] + [
        "[rank0]: torch._dynamo.exc.TorchRuntimeError: Dynamo failed to run FX node with fake "
        "tensors: call_function <built-in method addmm>:",  # its message goes on below
        "[rank0]: from user code:",
        "[rank0]:   Hint: Your code may result in an error when running in eager."])
    assert gpu_report_run.failure(output).startswith("[rank0]: torch._dynamo.exc.TorchRuntimeE")
    tail = gpu_report_run.log_tail(output)
    assert len(tail) == gpu_report_run.LOG_TAIL_LINES and tail[-1].endswith("in eager.")
