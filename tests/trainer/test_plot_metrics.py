"""tools/plot_metrics.py: training curves to PNG, several runs overlaid, clear errors."""

import json
import math

from conftest import run_cli, tool

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
    result = run_cli("tools/plot_metrics.py", "--run", *map(str, runs), "--out", str(out),
                     "--x", "tokens")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert not list(out.parent.glob(".*partial*"))


def test_run_without_metrics_is_one_line_and_status_2(tmp_path):
    result = run_cli("tools/plot_metrics.py", "--run", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"error: {tmp_path / 'metrics.jsonl'} does not exist: "
                                     "give a training out_dir")


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



def plot_metrics(capsys, *argv) -> tuple[int, str, str]:
    """The command's main() in this process (a subprocess pays matplotlib's import each time)."""
    code = tool("plot_metrics").main([str(arg) for arg in argv])
    return code, *capsys.readouterr()


def test_an_existing_png_is_replaced_only_with_force_and_only_an_earlier_plot(tmp_path, capsys):
    run = write_run(tmp_path / "ao_gpt")
    out = tmp_path / "curves.png"
    out.write_bytes(PNG_MAGIC + b"my annotated figure")
    assert plot_metrics(capsys, "--run", run, "--out", out, "--force") == (
        2, "", f"error: --out {out} is a file that tools/plot_metrics.py did not write: choose "
        "another name (--force replaces only an earlier plot of tools/plot_metrics.py)\n")
    assert out.read_bytes() == PNG_MAGIC + b"my annotated figure"
    out.unlink()
    assert plot_metrics(capsys, "--run", run, "--out", out)[0] == 0
    assert plot_metrics(capsys, "--run", run, "--out", out) == (
        2, "", f"error: --out {out} holds an earlier plot of tools/plot_metrics.py: pass --force "
        "to replace it, or choose another name\n")
    assert plot_metrics(capsys, "--run", run, "--out", out, "--force")[0] == 0
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_an_out_whose_suffix_is_not_png_is_refused(tmp_path, capsys):
    run = write_run(tmp_path / "ao_gpt")
    assert plot_metrics(capsys, "--run", run, "--out", tmp_path / "curves.txt") == (
        2, "", f"error: --out {tmp_path / 'curves.txt'}: tools/plot_metrics.py writes its plot as "
        ".png: name the file curves.png\n")
    assert not (tmp_path / "curves.txt").exists()


def test_an_out_that_is_a_folder_is_refused_before_plotting(tmp_path, capsys):
    run = write_run(tmp_path / "ao_gpt")
    assert plot_metrics(capsys, "--run", run, "--out", tmp_path) == (
        2, "", f"error: --out {tmp_path} is a folder: name a file in it\n")


def test_a_metrics_file_given_as_the_run_names_its_folder(tmp_path, capsys):
    run = write_run(tmp_path / "ao_gpt")
    assert plot_metrics(capsys, "--run", run / "metrics.jsonl") == (
        2, "", f"error: --run {run / 'metrics.jsonl'} is a file: give the training out_dir that "
               f"holds its metrics.jsonl ({run})\n")
