"""The sampling race's table (benchmarks/sampling_race.py, and the GPU report's race section) and
the tiny recipe its smoke runs and tests train in seconds."""

from __future__ import annotations

from aogpt.trainer.judge import headline

BASELINE = "GPT, one token per call"
# configs/synthetic.yaml's and configs/gpt_synthetic.yaml's recipe on a language, a network and a
# budget that train in seconds on a CPU: for the GPU report's smoke run and the tests
TINY_LANGUAGE = ["--seq-len", "16", "--vocab", "16", "--train-samples", "512",
                 "--val-samples", "32", "--topics", "2"]
TINY_TRAINING = ["model.block_size=16", "model.vocab_size=16", "model.n_layer=1",
                 "model.n_embd=32", "model.cond_dim=8", "train.max_steps=12",
                 "optim.decay_steps=12", "optim.warmup_steps=2", "order.schedule_steps=4",
                 "train.tokens_per_step=512", "train.micro_batch_size=32", "train.log_every=6",
                 "eval.every=12", "eval.batches=1", "checkpoint.every=12", "data.num_workers=1"]


def quality(row: dict) -> tuple[float, float]:
    """A row's judged number and its standard error (the true NLL on a synthetic language)."""
    return headline(row["judge"])


def table(rows: list[dict], header: dict) -> str:
    """The race's markdown table: each sampler's calls, acceptance, tokens/s by batch size (and
    against the GPT's), and what the judge says of its samples."""
    sizes = header["batch_sizes"]
    judge = "true NLL (nats/token)" if header["exact_judge"] else "judge"
    lines = ["| sampler | calls/token | drafts accepted | " + " | ".join(
        f"tokens/s, batch {b} (x GPT)" for b in sizes) + f" | {judge} | unigram entropy | "
        "repetition |", "|---" * (6 + len(sizes)) + "|"]
    for row in rows:
        value, error = quality(row)
        rates = " | ".join(f"{row['tokens_per_s'][b]:,.0f} ({row['speedup'][b]:.2f}x)"
                           for b in sizes)
        accepted = "" if row["acceptance"] is None else f"{row['acceptance']:.0%}"
        lines.append(f"| {row['label']} | {row['calls_per_token']:.3f} | {accepted} | {rates} | "
                     f"{value:.4f} +- {error:.4f} | {row['judge']['entropy']:.3f} | "
                     f"{row['judge']['repetition']:.3f} |")
    return "\n".join(lines) + "\n"
