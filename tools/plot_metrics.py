"""Training curves of one or more runs, as in the paper's figures 1-2: left-to-right vs any-order loss.

    python tools/plot_metrics.py --run runs/ao_gpt_small [--run runs/gpt_small ...] [--out curves.png]

Left panel: the training loss of the left-to-right samples (loss_l2r) and of the any-order ones
(loss_ao) against the step; right panel: the validation losses (val_loss_l2r, val_loss_ao).
Several runs are overlaid, one colour per run, solid = left to right, dashed = any order.
Reads out_dir/metrics.jsonl; where a resumed run logged a step twice, the later record wins.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: works on a cluster node without a display
import matplotlib.pyplot as plt  # noqa: E402

from aogpt import UsageError, cli_entry  # noqa: E402
from aogpt.files import write_atomic
from aogpt.trainer.metrics import curve, run_records  # noqa: E402

PANELS = (
    ("training loss", (("loss_l2r", "left to right", "-"), ("loss_ao", "any order", "--"))),
    ("validation loss", (("val_loss_l2r", "left to right", "-"), ("val_loss_ao", "any order", "--"))),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs="+", action="extend", required=True, type=Path,
                        metavar="OUT_DIR", help="a training out_dir (repeat to overlay runs)")
    parser.add_argument("--out", type=Path, default=None,
                        help="PNG to write (default: OUT_DIR/training_curves.png of the first run)")
    parser.add_argument("--x", choices=("step", "tokens"), default="step",
                        help="x axis: optimizer steps or tokens seen")
    parser.add_argument("--smooth", type=float, default=0.0,
                        help="exponential smoothing of the training curves, 0 (off) to <1")
    args = parser.parse_args(argv)
    if not 0.0 <= args.smooth < 1.0:
        raise UsageError(f"--smooth must be in [0, 1), got {args.smooth}")
    return args


def plot(runs: dict[str, list[dict]], x: str, smooth: float, out: Path) -> None:
    figure, axes = plt.subplots(1, len(PANELS), figsize=(12, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, (title, curves) in zip(axes, PANELS, strict=True):
        for colour, (name, records) in zip(colours * len(runs), runs.items(), strict=False):
            for key, label, style in curves:
                xs, ys = curve(records, key, x, smooth if title == "training loss" else 0.0)
                if xs:
                    axis.plot(xs, ys, style, color=colour, label=f"{name}: {label}")
        axis.set(title=title, xlabel="tokens" if x == "tokens" else "step", ylabel="loss (nats/token)")
        axis.grid(alpha=0.3)
        if axis.lines:
            axis.legend(fontsize=8)
    figure.tight_layout()
    write_atomic(out, lambda partial: figure.savefig(partial, format="png", dpi=120))
    plt.close(figure)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = {}
    for out_dir in args.run:
        name = out_dir.resolve().name
        runs[name if name not in runs else str(out_dir)] = run_records(out_dir)
    out = args.out or args.run[0] / "training_curves.png"
    plot(runs, args.x, args.smooth, out)
    steps = ", ".join(f"{name} to step {records[-1]['step']}" for name, records in runs.items())
    print(f"wrote {out} ({steps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
