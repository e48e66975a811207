"""Training curves of one or more runs, as in the paper's figures 1-2: left-to-right vs any-order
loss.

    python tools/plot_metrics.py --run runs/ao_gpt_small [--run runs/gpt_small ...]
        [--out curves.png] [--force]

First panel: the training loss of the left-to-right samples (loss_l2r) and of the any-order ones
(loss_ao) against the step; second: the validation losses (val_loss_l2r, val_loss_ao); then one
panel per zero-shot set the run scored while training (eval.sets, trainer/zero_shot.py): its
left-to-right perplexity and any-order bound, EMA weights (raw ones dotted, when scored), on a
log scale: the paper's curves. Several runs are overlaid, one colour per run, solid = left to
right, dashed = any order. Reads out_dir/metrics.jsonl; where a resumed run logged a step twice,
the later record wins. An existing PNG is replaced only with --force, and only when this
tool wrote it (its provenance, in the PNG's metadata, says so).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: works on a cluster node without a display
import matplotlib.pyplot as plt  # noqa: E402

from aogpt import UsageError, cli_entry  # noqa: E402
from aogpt.files import OutputFile, check_output_file, png_provenance, write_atomic  # noqa: E402
from aogpt.model.checkpoint import provenance  # noqa: E402
from aogpt.model.orders import ANY_ORDER, LEFT_TO_RIGHT, READINGS, per_reading  # noqa: E402
from aogpt.trainer.metrics import curve, loss_key, run_records  # noqa: E402
from aogpt.trainer.zero_shot import metric_name  # noqa: E402

# each reading's line style (model/orders.py per_reading: a new reading needs its entry here)
STYLES = per_reading("tools/plot_metrics.py STYLES",
                     {LEFT_TO_RIGHT.word: "-", ANY_ORDER.word: "--"})  # solid, dashed
PANELS = (  # (title, curves: (key, label, line style), y label, log scale)
    ("training loss", tuple((loss_key(reading), reading.label, STYLES[reading.word])
                            for reading in READINGS), "loss (nats/token)", False),
    ("validation loss", tuple((loss_key(reading, validation=True), reading.label,
                               STYLES[reading.word]) for reading in READINGS),
     "loss (nats/token)", False),
)
PLOT = OutputFile("tools/plot_metrics.py", "plot", (".png",))  # --out
ZERO_SHOT = re.compile(metric_name(  # the name of a zero-shot set's perplexity
    "(.+)", "(?:ema|raw)", f"(?:{'|'.join(reading.metric for reading in READINGS)})", "ppl"))


def zero_shot_sets(runs: dict[str, list[dict]]) -> list[str]:
    """The zero-shot sets found in the runs' records, in the order first seen."""
    return list(dict.fromkeys(match[1] for records in runs.values() for record in records
                              for key in record if (match := ZERO_SHOT.fullmatch(key))))


def zero_shot_panels(names: list[str]) -> tuple:
    """A panel per zero-shot set: its perplexities, EMA and raw."""
    l2r, ao = LEFT_TO_RIGHT, ANY_ORDER
    return tuple((f"{name} (zero-shot)", (
        (metric_name(name, "ema", l2r.metric, "ppl"), l2r.label, "-"),
        (metric_name(name, "ema", ao.metric, "ppl"), f"{ao.label} (bound)", "--"),
        (metric_name(name, "raw", l2r.metric, "ppl"), f"{l2r.label}, raw weights", ":"),
        (metric_name(name, "raw", ao.metric, "ppl"), f"{ao.label}, raw weights", "-."),
    ), "perplexity", True) for name in names)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs="+", action="extend", required=True, type=Path,
                        metavar="OUT_DIR", help="a training out_dir (repeat to overlay runs)")
    parser.add_argument("--out", type=Path, default=None,
                        help="PNG to write (default: OUT_DIR/training_curves.png of the first run)")
    parser.add_argument("--force", action="store_true", help="replace the PNG if it exists")
    parser.add_argument("--x", choices=("step", "tokens"), default="step",
                        help="x axis: optimizer steps or tokens seen")
    parser.add_argument("--smooth", type=float, default=0.0,
                        help="exponential smoothing of the training curves, 0 (off) to <1")
    args = parser.parse_args(argv)
    if not 0.0 <= args.smooth < 1.0:
        raise UsageError(f"--smooth must be in [0, 1), got {args.smooth}")
    for out_dir in args.run:
        if out_dir.is_file():
            raise UsageError(f"--run {out_dir} is a file: give the training out_dir that holds "
                             f"its metrics.jsonl ({out_dir.parent})")
    args.out = check_output_file(args.out or args.run[0] / "training_curves.png", "--out",
                                 args.force, PLOT)
    return args


def plot(runs: dict[str, list[dict]], x: str, smooth: float, out: Path, origin: dict) -> None:
    """The figure of `runs` into the PNG `out`, with `origin` (its provenance) in its metadata."""
    panels = PANELS + zero_shot_panels(zero_shot_sets(runs))
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 4.5 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis in axes.flat[len(panels):]:
        axis.set_visible(False)
    for axis, (title, curves, y_label, log_scale) in zip(axes.flat, panels, strict=False):
        for colour, (name, records) in zip(colours * len(runs), runs.items(), strict=False):
            for key, label, style in curves:
                xs, ys = curve(records, key, x, smooth if title == "training loss" else 0.0)
                if xs:
                    axis.plot(xs, ys, style, color=colour, label=f"{name}: {label}")
        axis.set(title=title, xlabel="tokens" if x == "tokens" else "step", ylabel=y_label)
        if log_scale:
            axis.set_yscale("log")
        axis.grid(alpha=0.3)
        if axis.lines:
            axis.legend(fontsize=8)
    figure.tight_layout()
    write_atomic(out, lambda partial: figure.savefig(partial, format="png", dpi=120,
                                                     metadata=png_provenance(origin)))
    plt.close(figure)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = {}
    for out_dir in args.run:
        name = out_dir.resolve().name
        runs[name if name not in runs else str(out_dir)] = run_records(out_dir)
    plot(runs, args.x, args.smooth, args.out, provenance(None, None, vars(args),
                                                          made_by=PLOT.made_by))
    steps = ", ".join(f"{name} to step {records[-1]['step']}" for name, records in runs.items())
    sets = zero_shot_sets(runs)
    print(f"wrote {args.out} ({steps}{'; zero-shot sets: ' + ', '.join(sets) if sets else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
