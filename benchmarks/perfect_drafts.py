"""Exact left-to-right speculative decoding with a perfect model: the network calls per token a
synthetic language costs a model that writes it exactly, and what a call may cost for an AO-GPT
to write left to right twice as fast as a GPT.

    python benchmarks/perfect_drafts.py --language data/synthetic [--drafts 1,2,3,4,6,8]
        [--trees 1,3] [--predrafts 0,8] [--gaps 4] [--num-texts 512] [--seed 0]
        [--json OUT] [--force]

A synthetic language (data_prep/synthetic_to_mds.py) is a hidden Markov model: every conditional
of it is known exactly. Here the language itself is the model, and model/sampler/speculative.py's
rule runs on it, left to right, as the sampler runs it on a network (K = each of --drafts, trees
of C = each of --trees candidates without branches, C = 1 being the chain, and R = each of
--predrafts pre-drafts, at most K):
- a call verifies the pending drafts in turn against their targets (each position's conditional
  given the final tokens and the drafts before it), by the recursive rule over the candidates;
- the first position that takes no candidate is redrawn from its residual; one that takes a
  candidate other than the first is final, and the position after it is drawn exactly; if every
  pending draft is taken, the position after them is drawn exactly;
- the call drafts the positions after the pending ones: the next from the row after the drafts
  (its conditional given them all), then K more from the copies, each from its marginal given
  the tokens fed (the positions between them unknown);
- the drafts after the stop stay pending with their proposals (at most K), old ones first;
  after a redrawn position the first R of them are drawn instead from its pre-draft rows, the
  marginals of the positions after it given the final tokens before it.
Run with a trained network in place of the language (a scratch check, not shipped), the same
code gives the sampler's own calls per token within the noise of 64 texts, so the rule here is
the sampler's. A model that writes the language a little worse can take fewer calls than a
perfect one: a smoother model's drafts agree with its own conditionals more often. The texts'
true NLL per token is reported beside, and matches the language's entropy as exact sampling's
must.

It also reports, for each gap g of --gaps, the share of drafts a perfect model accepts when it
drafts position t + g from x_<t (g positions between unknown: g = 1 is the first copy of a call,
whose position before was drawn in the same call) against its conditional given x_<t+g.

And for each sampler, the most a call may cost, in one-token calls of a GPT, for the AO-GPT to
write twice as fast: 1 / (2 x calls per token).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from results import ResultsFile, show_table

from aogpt import UsageError, check_counts, cli_entry, comma_counts
from aogpt.data_prep.manifest import read_manifest
from aogpt.data_prep.synthetic import SyntheticLanguage, load_language
from aogpt.files import OutputFile, check_output_file
from aogpt.model.sampler.config import fresh_drafts

JSON = OutputFile("benchmarks/perfect_drafts.py", "perfect-model report", (".json",))


@dataclass
class Entry:
    """A drafted position: its candidates (the first is the draft) and the proposal they were
    drawn from without replacement."""

    candidates: list[int]
    proposal: np.ndarray


class PerfectModel:
    """The language's exact distributions along one text, left to right: beliefs over its hidden
    state, kept for the final tokens and extended over drafts on demand."""

    def __init__(self, language: SyntheticLanguage):
        self.language = language
        self.emission = language.emission  # (hidden, vocab)

    def start(self) -> np.ndarray:
        return np.asarray(self.language.start, dtype=np.float64)[None]  # p(s_0), (1, hidden)

    def advance(self, belief: np.ndarray) -> np.ndarray:
        return self.language.chain.advance(belief)

    def observe(self, belief: np.ndarray, token: int) -> np.ndarray:
        """p(s_{t+1} | x_<=t) from p(s_t | x_<t) and x_t."""
        joint = belief * self.emission[:, token][None]
        return self.advance(joint / joint.sum())

    def tokens(self, belief: np.ndarray) -> np.ndarray:
        """p(x_t | ...) from p(s_t | ...), (vocab,)."""
        probs = (belief @ self.emission)[0]
        return probs / probs.sum()


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    return min(int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum())), len(probs) - 1)


def with_candidates(proposal: np.ndarray, tree: int, rng: np.random.Generator) -> Entry:
    """The draft and tree - 1 more drawn from `proposal` without replacement (fewer if it has
    fewer tokens)."""
    left, candidates = proposal.copy(), []
    while len(candidates) < tree and left.sum() > 0:
        candidates.append(draw(left, rng))
        left[candidates[-1]] = 0.0
    return Entry(candidates, proposal)


def decide(target: np.ndarray, entry: Entry, rng: np.random.Generator) -> tuple[int, int]:
    """The recursive rule over the entry's candidates: (candidate taken or -1, the token)."""
    q, p = target.copy(), entry.proposal.copy()
    for c, token in enumerate(entry.candidates):
        if c:
            q, p = q / q.sum(), p / max(p.sum(), 1e-300)
        if rng.random() * p[token] < q[token]:
            return c, token
        excess = np.clip(q - p, 0.0, None)
        q = excess if excess.sum() > 0 else q
        p[token] = 0.0
    return -1, draw(q, rng)


def generate(model: PerfectModel, n: int, window: int, tree: int, predraft: int,
             rng: np.random.Generator) -> tuple[list[int], int, int, int]:
    """One text of n tokens: (tokens, calls, drafts decided, drafts accepted)."""
    final: list[int] = []
    belief = model.start()  # p(s_A | the final tokens)
    pending: list[Entry] = []
    calls = decided = accepted = 0
    while len(final) < n:
        calls += 1
        made: list[int] = []  # tokens made final by this call
        along = belief  # the belief along the fed drafts: the first candidates
        stop, redrawn, other = len(pending), False, False
        for j, entry in enumerate(pending):
            taken, token = decide(model.tokens(along), entry, rng)
            decided += 1
            accepted += taken >= 0
            made.append(token)
            if taken != 0:  # none taken (a residual draw), or another candidate: the call stops
                stop, redrawn, other = j, taken < 0, taken > 0
                break
            along = model.observe(along, token)
        # the rows after the pending drafts saw the first candidates of them all
        fed_belief = belief
        for entry in pending:
            fed_belief = model.observe(fed_belief, entry.candidates[0])
        # the row after the drafts, then the copies: marginals further on, up to the text's end
        fresh = [fed_belief][: n - len(final) - len(pending)]
        while fresh and len(fresh) < min(window + 1, n - len(final) - len(pending)):
            fresh.append(model.advance(fresh[-1]))
        drafted = pending + [with_candidates(model.tokens(b), tree, rng) for b in fresh]
        if stop == len(pending) < len(drafted):  # every draft taken: the row after them saw
            made.append(drafted[stop].candidates[0])  # only final tokens
        elif other:  # the candidate's own row saw only final tokens: the next position, exactly
            after = model.observe(along, made[-1])
            made.append(draw(model.tokens(after), rng))
        for token in made[: n - len(final)]:
            belief = model.observe(belief, token)
            final.append(token)
        pending = drafted[len(made):][:window]
        if redrawn:  # pre-drafts: rows that saw the final tokens before it draft what follows
            ahead = along
            for i in range(min(predraft, len(pending))):
                ahead = model.advance(ahead)
                pending[i] = with_candidates(model.tokens(ahead), tree, rng)
    return final[:n], calls, decided, accepted


def gap_acceptance(language: SyntheticLanguage, n: int, gaps: int, texts: int, seed: int
                   ) -> list[float]:
    """For g = 1..gaps: the mean over texts and positions of sum_v min(p(x_t+g = v | x_<t),
    p(x_t+g = v | x_<t+g)), the share of drafts a perfect model accepts at gap g."""
    x = language.sample(texts, n, seed=seed)
    emission = language.emission
    belief = np.broadcast_to(language.start, (texts, len(language.start))).copy()
    beliefs = []  # p(s_t | x_<t), each (texts, hidden)
    for t in range(n):
        if t:
            belief = language.chain.advance(belief)
        beliefs.append(belief)
        joint = belief * emission[:, x[:, t]].T
        belief = joint / joint.sum(axis=1, keepdims=True)
    shares = []
    for g in range(1, gaps + 1):
        overlaps = []
        for t in range(n - g):
            ahead = beliefs[t]
            for _ in range(g):
                ahead = language.chain.advance(ahead)
            overlaps.append(np.minimum(ahead @ emission, beliefs[t + g] @ emission).sum(axis=1))
        shares.append(float(np.mean(overlaps)))
    return shares


def table(data: dict) -> str:
    """The rows as markdown, with the gaps' acceptance under them."""
    lines = ["| sampler | calls/token | drafts accepted | true NLL (nats/token) | "
             "a call may cost, for 2x |", "|---|---|---|---|---|"]
    lines += [f"| {r['sampler']} | {r['calls_per_token']:.3f} | {r['accepted']:.0%} | "
              f"{r['true_nll']:.4f} +- {r['true_nll_se']:.4f} | "
              f"{r['call_cost_for_2x']:.2f} GPT calls |" for r in data["results"]]
    gaps = ", ".join(f"{g}: {share:.1%}" for g, share in
                     enumerate(data["gap_acceptance"], start=1))
    return "\n".join(lines + ["", f"The language's entropy: {data['entropy']:.4f} nats per token. "
                               f"Drafts accepted by gap: {gaps}."])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--language", required=True,
                        help="a synthetic language's data folder (data_prep/synthetic_to_mds.py)")
    parser.add_argument("--drafts", default="1,2,3,4,6,8", help="draft lengths K")
    parser.add_argument("--trees", default="1,3", help="candidates per drafted position")
    parser.add_argument("--predrafts", default="0,8",
                        help="drafts after a redrawn position from its pre-draft rows (at most K)")
    parser.add_argument("--gaps", type=int, default=4, help="gaps whose acceptance is reported")
    parser.add_argument("--num-texts", type=int, default=512, help="texts per sampler")
    parser.add_argument("--seq-len", type=int, help="tokens per text (the language's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--force", action="store_true",
                        help="replace --json if this benchmark wrote it")
    args = parser.parse_args(argv)
    args.drafts = comma_counts(args.drafts, "--drafts")
    args.trees = comma_counts(args.trees, "--trees")
    args.predrafts = comma_counts(args.predrafts, "--predrafts", minimum=0)
    check_counts(args, "num_texts", "gaps", "seq_len")
    if args.json:
        check_output_file(args.json, "--json", args.force, JSON)
    return args


def measure(model: PerfectModel, n: int, window: int, tree: int, predraft: int,
            args: argparse.Namespace) -> dict:
    """One sampler's row: --num-texts texts drawn with the perfect model, judged exactly."""
    rng = np.random.default_rng([args.seed, window, tree, predraft])
    texts, calls, decided, accepted = [], 0, 0, 0
    for _ in range(args.num_texts):
        tokens, c, d, a = generate(model, n, window, tree, predraft, rng)
        texts.append(tokens)
        calls, decided, accepted = calls + c, decided + d, accepted + a
    nll = model.language.conditional_nll(np.array(texts)).sum(axis=1) / n
    per_token = calls / (args.num_texts * n)
    label = (f"K={window}" + (f" C={tree}" if tree > 1 else "")
             + (f" R={predraft}" if predraft else ""))
    print(f"{label:12s} {per_token:.3f} calls/token, {accepted / max(decided, 1):.0%} of the "
          "drafts accepted", flush=True)
    return {"sampler": label, "draft": window, "tree": tree, "predraft": predraft,
            "calls_per_token": per_token, "accepted": accepted / max(decided, 1),
            "true_nll": float(nll.mean()),
            "true_nll_se": float(nll.std(ddof=1) / math.sqrt(len(nll))),
            "call_cost_for_2x": 1 / (2 * per_token)}


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    language = load_language(args.language, "--language")
    n = args.seq_len or read_manifest(args.language)["seq_len"]
    if args.gaps >= n:
        raise UsageError(f"--gaps must be below the text's length ({n}), got {args.gaps}")
    entropy, error = language.entropy_per_token(n)
    print(f"{language.summary()}; n = {n}, entropy {entropy:.4f} +- {error:.4f} nats per token",
          flush=True)
    gaps = gap_acceptance(language, n, args.gaps, min(args.num_texts, 512), args.seed)
    for g, share in enumerate(gaps, start=1):
        print(f"a draft {g} position(s) ahead of the last known token: {share:.1%} accepted")
    results = ResultsFile(args.json, {
        "provenance": {"made_by": JSON.made_by,
                       "settings": {key: str(value) for key, value in vars(args).items()}},
        "language": str(args.language), "fingerprint": language.fingerprint, "seq_len": n,
        "num_texts": args.num_texts, "seed": args.seed, "entropy": entropy,
        "gap_acceptance": gaps, "results": []})
    model = PerfectModel(language)
    for tree in args.trees:
        for window in args.drafts:
            for predraft in sorted({fresh_drafts(window, r) for r in args.predrafts}):
                results.data["results"].append(measure(model, n, window, tree, predraft, args))
                results.row_done()
    results.finish()
    show_table(table(results.data), None)
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
