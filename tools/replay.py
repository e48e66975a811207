"""Replay samples call by call in a browser: one self-contained HTML page from a samples file.

    python tools/replay.py SAMPLES.jsonl --out FILE.html [--force] [--tokenizer-file PATH]

SAMPLES.jsonl is what trainer/sample.py --out writes, or a run's in-training samples
(out_dir/samples/step_<step>.jsonl). The page (aogpt/trainer/replay) needs no server and no
network: open it from disk. Each sample is a row of cells, one per position, the given tokens
marked; play, pause, step forward and back, or drag the slider over the calls; hover over a cell
for its token, the call that made it final and, for a planner, its score. Samples drawn with
trainer/sample.py --record-calls replay their true network calls (a call's revealed tokens at
once, the speculative sampler's drafts as drafted, then accepted or rejected and redrawn, the
planner's candidates); others replay one position at a time in the order they were generated.
The text decoded so far is shown under the cells, with the sample's network calls, acceptance
and exact log-likelihood where its record has them. An existing page is replaced only with
--force, and only when this tool wrote it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aogpt import cli_entry
from aogpt.data_prep.synthetic import TokenIds
from aogpt.data_prep.tokenizer import load_gpt2
from aogpt.files import OutputFile, check_output_file
from aogpt.model.checkpoint import provenance
from aogpt.trainer.replay import pieces_for, read_samples, write_page

PAGE = OutputFile("tools/replay.py", "replay page", (".html",))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python tools/replay.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples", type=Path, help="a samples file (JSON Lines)")
    parser.add_argument("--out", type=Path, required=True, metavar="FILE.html",
                        help="the page to write")
    parser.add_argument("--force", action="store_true", help="replace a page this tool wrote")
    parser.add_argument("--tokenizer-file", default=None, help="GPT-2 ranks file (offline)")
    return parser.parse_args(argv)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_output_file(args.out, "--out", args.force, PAGE)
    records = read_samples(args.samples, "SAMPLES")
    pieces = pieces_for(records, {"a synthetic language's ids": TokenIds,
                                  "GPT-2's tokenizer": lambda: load_gpt2(args.tokenizer_file)},
                        f"SAMPLES {args.samples}")
    origin = provenance(None, None, vars(args), made_by=PAGE.made_by,
                        samples=str(args.samples.resolve()))
    recorded = sum("calls" in record for record in records)
    write_page(args.out, records, pieces, title=f"Replay of {args.samples.name}",
               about=f"{len(records)} samples from {args.samples}; "
                     f"{recorded} with their network calls recorded", origin=origin)
    print(f"wrote {args.out} ({len(records)} samples, {args.out.stat().st_size / 1e3:,.0f} kB): "
          "open it in a browser")
    return 0


if __name__ == "__main__":
    sys.exit(main())
