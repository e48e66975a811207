"""Converts a checkpoint of the paper's code (AO-GPT-MDM's ckpt_<iter>.pt) into a consolidated one.

    python tools/import_official.py --ckpt ckpt_250000.pt --out runs/aogpt_small_official [--force]

writes OUT/model.safetensors (and model.json) with the raw weights and the EMA (the weights the
paper evaluates), so `trainer/evaluate.py --ckpt OUT` and `trainer/sample.py --ckpt OUT` use the
released models.
Files already in OUT are replaced only with --force, and only when this tool wrote them; a
training run's folder is refused.
"""

import argparse
import sys
from pathlib import Path

from aogpt import cli_entry
from aogpt.files import OutputFile, check_output_file
from aogpt.model import save_consolidated
from aogpt.model.official import convert_official, load_official
from aogpt.run_folder import CONFIG_FILE, WEIGHTS_FILE, check_not_a_run

CONVERTED = OutputFile("tools/import_official.py", "converted checkpoint",
                       (".safetensors", ".json"))  # made_by in the checkpoint's meta


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True,
                        help="checkpoint file saved by the paper's training script")
    parser.add_argument("--out", required=True,
                        help="output folder; model.safetensors and model.json are written inside")
    parser.add_argument("--force", action="store_true",
                        help="replace the checkpoint files of --out if they exist")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="allow arbitrary Python objects in the file "
                             "(only for files you trust)")
    return parser.parse_args(argv)


def check_out(out: Path, force: bool) -> None:
    """--out must not be a training run (its root would then load as this checkpoint instead of
    the run's own weights), and its checkpoint files are replaced only with --force, and only
    when this tool wrote them."""
    check_not_a_run(out, "--out", "give a new folder for the converted checkpoint")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        check_output_file(out / name, "--out", force, CONVERTED)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_out(Path(args.out), args.force)
    ckpt = load_official(args.ckpt, trust_pickle=args.trust_pickle)
    config, raw, ema, meta = convert_official(ckpt,
                                              source=f"official AO-GPT checkpoint {args.ckpt}")
    out = save_consolidated(Path(args.out), config, raw, ema, **meta, made_by=CONVERTED.made_by)
    n_params = sum(t.numel() for t in raw.values())
    print(f"wrote {out}: AO-GPT {config.n_layer} layers x {config.n_embd}, {n_params / 1e6:.2f}M "
          f"parameters, weights raw"
          f"{' + EMA' if ema is not None else ' only (no EMA in the file)'}, "
          f"step {meta['step']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
