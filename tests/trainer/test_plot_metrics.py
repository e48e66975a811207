"""tools/plot_metrics.py: training curves to PNG, several runs overlaid, clear errors."""

import json
import math

from conftest import run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(out_dir, steps=40, l2r_every=3):
    out_dir.mkdir(parents=True)
    lines = []
    for step in range(1, steps + 1):
        record = {"step": step, "tokens_seen": 2048 * step, "loss": 10 - math.log(step),
                  "loss_ao": 10.2 - math.log(step),
                  "loss_l2r": 9.8 - math.log(step) if step % l2r_every == 0 else None}
        if step % 10 == 0:
            record.update(val_loss_l2r=9.9 - math.log(step), val_loss_ao=10.3 - math.log(step))
        lines.append(json.dumps(record))
    lines.insert(20, json.dumps({"step": 25, "loss": 99.0}))  # a resumed run logs a step again
    (out_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return out_dir


def test_one_run_plots_next_to_its_metrics(tmp_path):
    run = write_run(tmp_path / "ao_gpt")
    result = run_cli("tools/plot_metrics.py", "--run", str(run), "--smooth", "0.5")
    assert result.returncode == 0, result.stderr
    assert (run / "training_curves.png").read_bytes().startswith(PNG_MAGIC)
    assert "ao_gpt to step 40" in result.stdout


def test_several_runs_overlay_into_one_file(tmp_path):
    runs = [write_run(tmp_path / "ao_gpt"), write_run(tmp_path / "gpt", l2r_every=1)]
    out = tmp_path / "figures" / "compare.png"
    result = run_cli("tools/plot_metrics.py", "--run", *map(str, runs), "--out", str(out), "--x", "tokens")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert not list(out.parent.glob(".*partial*"))


def test_run_without_metrics_is_one_line_and_status_2(tmp_path):
    result = run_cli("tools/plot_metrics.py", "--run", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'metrics.jsonl'} does not exist: give a training out_dir"


def test_zero_shot_sets_scored_while_training_get_a_panel_each(tmp_path):
    run = write_run(tmp_path / "ao_gpt")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    for step in (10, 20, 30):  # what trainer/zero_shot.py logs at each evaluation
        lines.append(json.dumps({"step": step, "tokens_seen": 2048 * step, **{
            f"eval/{name}/{weights}/{reading}_ppl": 900 / step + offset
            for name in ("wikitext2", "ptb") for weights in ("ema", "raw")
            for reading, offset in (("l2r", 0), ("ao", 50))}}))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    result = run_cli("tools/plot_metrics.py", "--run", str(run), "--x", "tokens")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("zero-shot sets: wikitext2, ptb)")
    assert (run / "training_curves.png").read_bytes().startswith(PNG_MAGIC)
