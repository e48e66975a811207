"""Generative perplexity: how likely a judge language model finds generated samples.

    python trainer/genppl.py --samples FILE.jsonl --judge PATH [--batch-size B] [--device D]
        [--json OUT [--force]]
    torchrun --nproc-per-node N trainer/genppl.py ...      # the batches spread over N processes

--samples is what trainer/sample.py writes (a `tokens` list per line). --judge is either a local
Hugging Face GPT-2 folder (config.json + weights, e.g. gpt2-large saved with save_pretrained; it
is read from disk only, never downloaded) or any checkpoint of this project, which then scores
left to right. As in the paper (SEDD's protocol), each sample is scored on its tokens 2..n given
the ones before (no BOS), and the report holds:
  mean_ppl       mean over samples of exp(mean NLL of the sample) (the paper's number), and std
  ppl            exp(mean NLL over all scored tokens)
  entropy        mean over samples of the unigram entropy of the sample's tokens (nats): a guard
                 against degenerate samples, which a judge may like (repetitions) but which
                 have a low entropy (natural 1024-token text: about 5.5-5.7)
--json writes the report (an existing file is replaced only with --force) with its provenance:
the judge (a project checkpoint: the file read, its tag and step, the weights), the samples file
and the provenance its first line carries (the checkpoint sample.py read), every flag, and the
code's version and commit. Under a launcher (torchrun, deepspeed, srun: trainer/ranks.py) each
process judges its share of the batches on its own device and the first writes the report: the
one-process report, number for number.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from aogpt import UsageError, check_counts, check_input_file, cli_entry
from aogpt.files import OutputFile, check_output_file, write_json_atomic
from aogpt.model.checkpoint import provenance
from aogpt.model.precision import resolve_device
from aogpt.trainer.judge import Judge, check_judge_matches, format_report, generative_perplexity
from aogpt.trainer.ranks import RankShare

# --json; an earlier report without made_by is known by its keys
REPORT = OutputFile("trainer/genppl.py", "generative-perplexity report", (".json",),
                    signature=("mean_ppl", "tokens_scored", "entropy"))


def read_samples(path: Path) -> tuple[list[list[int]], dict | None]:
    """The token lists of a sample.py --out file, and the provenance its first line carries
    (None in files without one, e.g. the trainer's samples)."""
    check_input_file(path, "--samples", "a JSONL file written by trainer/sample.py --out")
    samples, origin = [], None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            samples.append([int(t) for t in record["tokens"]])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise UsageError(f"{path}:{number}: not a sample line with a `tokens` list "
                             f"({err})") from err
        if len(samples) == 1:
            origin = record.get("provenance")
    return samples, origin


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=Path, required=True, help="JSONL from trainer/sample.py")
    parser.add_argument("--judge", required=True,
                        help="local Hugging Face GPT-2 folder, or a checkpoint of this project")
    parser.add_argument("--weights", choices=("ema", "raw"), default="ema",
                        help="weights of a project-checkpoint judge (default ema)")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per forward (default 8)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--force", action="store_true", help="replace the --json file if it exists")
    # the deepspeed launcher's
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    share = RankShare.join()
    samples, sampled_from, judge = share.checked(lambda: preflight(args, share))
    report = generative_perplexity(samples, judge, args.batch_size, progress=share.is_main,
                                   share=share)
    if not share.is_main:
        return 0
    print(format_report(report))
    if args.json:
        origin = provenance(judge.source, args.weights if judge.source else None, vars(args),
                            made_by=REPORT.made_by, judge=str(Path(args.judge).resolve()),
                            samples=str(args.samples.resolve()), sampled_from=sampled_from)
        write_json_atomic({**report, "provenance": origin}, args.json, indent=2)
        print(f"wrote {args.json}")
    return 0


def preflight(args: argparse.Namespace, share: RankShare) -> tuple:
    """The samples, the provenance they carry and the judge on this rank's device, once every
    input and output is checked."""
    check_counts(args, "batch_size")
    if args.json:
        check_output_file(args.json, "--json", args.force, REPORT)
    samples, sampled_from = read_samples(args.samples)
    check_judge_matches(args.judge, sampled_from)
    device = resolve_device(args.device, own=share.env.device)
    return samples, sampled_from, Judge(args.judge, device, args.weights)


if __name__ == "__main__":
    sys.exit(main())
