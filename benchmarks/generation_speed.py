"""Generation time: the decoder's KV-cache sampler against an encoder-style masked-diffusion
sampler.

    python benchmarks/generation_speed.py [--preset small] [--batch-size B] [--seq-len N]
        [--steps 16,64,256,N] [--compile auto|on|off|both] [--json OUT]

In one process, on the same network, weights and device, for each number of steps S:
- decoder: model/sampler/, the paper's AO-GPT sampler (KV cache, Lemma 1, CUDA graphs on a GPU);
- encoder: what SEDD/MDLM do at every step: a full bidirectional forward over all n slots (the
  same network run with full attention, masked positions fed as [None]), then the step's tokens
  drawn from the logits of the positions revealed. Its outputs are meaningless for a decoder's
  weights: it is a cost model, with the same per-token cost as the decoder, given its best
  configuration (the attention kernels' unmasked path, head only where tokens are drawn, the
  network call as a CUDA graph on a GPU).
Both draw the same numbers of tokens per step (the paper's deterministic linear schedule) with the
same sampling code. Prints both times, their ratio and the token rows each pushed through the
network per sequence (the decoder's stay near 2n at any S, the encoder's are S x n).
Both run eager and compiled (torch.compile: the decoder's whole step, the encoder's network
call), so the ratio is reported eager/eager and compiled/compiled (--compile both, the default
on a GPU; a CPU compiles for longer than these runs take, so it defaults to eager). Compilation
and graph capture never count as generation: each sampler first generates once on other samples
(the same step shapes), and that warm-up is reported apart (decoder_warm_up_s,
encoder_warm_up_s: compilation, capture and one generation). The decoder's milliseconds per
network call are set against the floor of the device's memory bandwidth: every call must read the
weights its matmuls use and the KV cache its attention sees (on average half of it over a
generation of S = n steps).
Defaults: the paper's setting on a GPU (small model, batch 32, n = 1024); a smaller one on a CPU
(batch 8, n = 128); bf16 weights on a GPU and on CPUs with native bf16 (AVX512-BF16 or AMX),
fp32 on others, where bf16 is emulated ~50x slower (--dtype overrides). The samplers' timed runs
are interleaved so that load from other processes hits both alike. The JSON is written after
every row (benchmarks/results.py).
"""

import argparse
import sys
import time
from pathlib import Path

import torch
from results import ResultsFile

from aogpt import UsageError, check_counts, cli_entry
from aogpt.model import AOGPT
from aogpt.model.attention import BIDIRECTIONAL
from aogpt.model.config import ModelConfig, medium, small, tiny
from aogpt.model.precision import auto_dtype, resolve_device
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, sample_from_logits
from aogpt.model.sampler.draw import position_uniforms
from aogpt.model.sampler.engine import draw_orders
from aogpt.model.sampler.parallel import reveal_counts
from aogpt.model.sampler.strategy import KEY_BLOCK
from aogpt.trainer.metrics import peak_memory_bandwidth

PRESETS = {"tiny": tiny, "small": small, "medium": medium}
GPU_DEFAULTS = {"batch_size": 32, "seq_len": 1024, "steps": "16,64,256,1024"}
CPU_DEFAULTS = {"batch_size": 8, "seq_len": 128, "steps": "16,64,128"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    parser.add_argument("--batch-size", type=int, help="sequences per batch (GPU 32, CPU 8)")
    parser.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto",
                        help="auto (default): bf16 on a GPU or a CPU with AVX512-BF16/AMX, "
                             "else fp32")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (GPU 1024, CPU 128)")
    parser.add_argument("--steps",
                        help="comma list of step counts (GPU 16,64,256,1024; CPU 16,64,128)")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per sampler, best kept")
    parser.add_argument("--no-cuda-graphs", action="store_true",
                        help="eager decoder steps on a GPU")
    parser.add_argument("--compile", choices=("auto", "on", "off", "both"), default="auto",
                        help="torch.compile both samplers: auto (default) = both on a GPU, "
                             "off on a CPU")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


class EncoderSampler:
    """The encoder MDM's generation loop (SEDD/MDLM style) on the decoder's network, in its best
    configuration: full attention through the kernels' unmasked path (no mask tensor), the head
    applied only to the positions revealed at each step, and on a GPU the network call (the
    same shape at every step) replayed as a CUDA graph."""

    def __init__(self, model: AOGPT, batch_size: int, seq_len: int, config: SamplingConfig,
                 cuda_graphs: bool, compiled: bool = False):
        self.model, self.seq_len, self.config = model, seq_len, config
        self.cuda_graphs = cuda_graphs
        device = model.lm_head.weight.device
        # the network's inputs, at fixed addresses for the graph: known slots read their token
        # at their position, masked ones read [None] (position -1)
        self.tokens = torch.zeros(batch_size, seq_len, dtype=torch.long, device=device)
        self.inputs = torch.full_like(self.tokens, -1)
        self.positions = torch.arange(seq_len, device=device).expand(batch_size, -1).contiguous()
        self._graph: tuple[torch.cuda.CUDAGraph, torch.Tensor] | None = None
        with torch.no_grad():  # its AdaLN tables once, as the decoder's
            self.adaln_tables, _ = model.adaln_tables()
        self._network = (torch.compile(self._forward, dynamic=False, fullgraph=True) if compiled
                         else self._forward)

    def _forward(self) -> torch.Tensor:
        return self.model.forward_stream(self.tokens, self.inputs, self.positions, BIDIRECTIONAL,
                                         adaln_tables=self.adaln_tables)

    def hidden(self) -> torch.Tensor:
        """(b, n, d): the network on the current inputs."""
        if not self.cuda_graphs:
            return self._network()
        if self._graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # workspaces are set up outside the capture
                self._network()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._network()
            self._graph = (graph, out)
        graph, out = self._graph
        graph.replay()
        return out

    @torch.no_grad()
    def generate(self, sample_ids: torch.Tensor) -> int:
        """Runs the whole loop for these samples; returns the token rows per sequence."""
        model, n, config = self.model, self.seq_len, self.config
        b, device = len(sample_ids), sample_ids.device
        nothing_given = torch.zeros(b, n, dtype=torch.bool, device=device)
        orders = draw_orders(config, nothing_given, sample_ids)
        counts = reveal_counts(config, nothing_given.sum(dim=1), n, sample_ids)[0].tolist()
        uniforms = position_uniforms(config, sample_ids, n)
        self.tokens.zero_()
        self.inputs.fill_(-1)
        for c, hi in zip(counts[:-1], counts[1:], strict=True):
            hidden = self.hidden()
            targets = orders[:, c:hi]  # (b, r): the positions revealed at this step
            chosen = hidden.gather(1, targets[..., None].expand(-1, -1, hidden.size(-1)))
            logits = model.lm_head(chosen).float()  # (b, r, vocab)
            drawn = sample_from_logits(logits, config, uniforms.gather(1, targets))
            self.tokens.scatter_(1, targets, drawn)
            self.inputs.scatter_(1, targets, targets)  # now known, at their own positions
        return len(counts[1:]) * n


def timed(run, device: torch.device) -> tuple[float, object]:
    """Seconds of one run (synchronized on a GPU) and its result."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result


def measure(model: AOGPT, steps: int, args: argparse.Namespace, device: torch.device,
            compiled: bool) -> dict:
    config = SamplingConfig(steps=steps, seed=0)
    b, n = args.batch_size, args.seq_len
    ids = torch.arange(b, device=device)
    graphs = device.type == "cuda" and not args.no_cuda_graphs
    decoder = KVCacheSampler(model, b, n, config, cuda_graphs=graphs, compile=compiled)
    # warm-up: the same step shapes (compiled, captured) on other samples
    decoder_warm_up_s, _ = timed(lambda: decoder.generate(ids + b), device)
    encoder = EncoderSampler(model, b, n, config, cuda_graphs=graphs, compiled=compiled)
    # warm-up: its one network shape (compiled, captured), as generate runs it
    with torch.no_grad():
        encoder_warm_up_s, _ = timed(encoder.hidden, device)
    # interleaved runs, the shortest of each kept: load from elsewhere only ever adds time
    decoder_s = encoder_s = float("inf")
    for _ in range(args.repeats):
        seconds, generation = timed(lambda: decoder.generate(ids), device)
        decoder_s = min(decoder_s, seconds)
        seconds, encoder_rows = timed(lambda: encoder.generate(ids), device)
        encoder_s = min(encoder_s, seconds)
    return {"steps": steps, "compiled": compiled, "decoder_s": decoder_s, "encoder_s": encoder_s,
            "ratio": encoder_s / decoder_s, "decoder_rows": generation.rows,
            "encoder_rows": encoder_rows, "network_calls": generation.network_calls,
            "decoder_ms_per_call": decoder_s / generation.network_calls * 1e3,
            "decoder_warm_up_s": decoder_warm_up_s, "encoder_warm_up_s": encoder_warm_up_s}


def floor_bytes_per_call(model: AOGPT, batch_size: int, seq_len: int) -> float:
    """Bytes a decoder call must read at least, averaged over a generation of S = n calls: the
    weights of every matmul (the blocks' and the head; embeddings and the AdaLN tables are only
    gathered, a few rows per call) and the KV cache of every layer up to the slots it attends
    (1..n + 1 over the generation: (n + 2) / 2 on average, padding to KEY_BLOCK not counted)."""
    c = model.config
    lookups = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    adaln = [p for name, p in model.named_parameters() if "adaLN" in name]
    skipped = {id(p) for p in lookups + adaln}
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters()
                       if id(p) not in skipped)
    element = model.lm_head.weight.element_size()
    kv_bytes = c.n_layer * 2 * batch_size * c.n_embd * (seq_len + 2) / 2 * element
    return weight_bytes + kv_bytes


def check_sizes(args: argparse.Namespace, device: torch.device) -> tuple[ModelConfig, list[int]]:
    """The --preset's config and the step counts to time; the sizes left out take the device's
    defaults (args.batch_size, args.seq_len)."""
    check_counts(args, "batch_size", "seq_len", "repeats")
    defaults = GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    args.batch_size = args.batch_size or defaults["batch_size"]
    args.seq_len = args.seq_len or defaults["seq_len"]
    try:
        steps = [int(s) for s in (args.steps or defaults["steps"]).split(",")]
    except ValueError as err:
        raise UsageError(f"--steps must be a comma list of integers: {err}") from err
    if any(not 1 <= s <= args.seq_len for s in steps):
        raise UsageError(f"--steps must each be in 1..{args.seq_len} (the sequence length)")
    config = PRESETS[args.preset]()
    if args.seq_len > config.block_size:
        raise UsageError(f"--seq-len {args.seq_len} exceeds the {args.preset} block size "
                         f"{config.block_size}")
    return config, steps


def results_file(model: AOGPT, args: argparse.Namespace, device: torch.device,
                 dtype: torch.dtype) -> ResultsFile:
    """The --json file's header (the setting and the decoder call's memory floor), also said."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bandwidth = peak_memory_bandwidth(name) if device.type == "cuda" else None
    floor_ms = (floor_bytes_per_call(model, args.batch_size, args.seq_len) / bandwidth * 1e3
                if bandwidth else None)
    print(f"{args.preset}: {model.num_params() / 1e6:.1f}M params on {name} ({dtype}), batch "
          f"{args.batch_size}, n = {args.seq_len}, best of {args.repeats}"
          + (f"; memory floor {floor_ms:.3f} ms per decoder call" if floor_ms else ""))
    return ResultsFile(args.json, {
        "preset": args.preset, "device": name, "dtype": str(dtype), "batch_size": args.batch_size,
        "seq_len": args.seq_len, "memory_bandwidth": bandwidth, "hbm_floor_ms": floor_ms,
        "key_block": KEY_BLOCK, "results": []})


TABLE_HEADER = (f"{'steps':>6}{'compiled':>10}{'decoder s':>11}{'encoder s':>11}{'ratio':>8}"
                f"{'ms/call':>9}{'decoder rows':>14}{'encoder rows':>14}{'warm-up s':>11}")


def table_row(row: dict) -> str:
    return (f"{row['steps']:>6}{'yes' if row['compiled'] else 'no':>10}{row['decoder_s']:>11.3f}"
            f"{row['encoder_s']:>11.3f}{row['ratio']:>7.1f}x"
            f"{row['decoder_ms_per_call']:>9.3f}{row['decoder_rows']:>14}"
            f"{row['encoder_rows']:>14}{row['decoder_warm_up_s']:>11.1f}")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    config, steps = check_sizes(args, device)
    torch.manual_seed(0)
    dtype = (auto_dtype(device) if args.dtype == "auto"
             else torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    model = AOGPT(config).to(device=device, dtype=dtype).eval()
    modes = {"auto": [False, True] if device.type == "cuda" else [False], "on": [True],
             "off": [False], "both": [False, True]}[args.compile]
    results = results_file(model, args, device, dtype)
    print(TABLE_HEADER)
    # The process's first generations run slower (allocator, kernel set-up: the first step count
    # measured ~2x its later time on one CPU thread) even after each sampler's own warm-up.
    measure(model, steps[0], argparse.Namespace(**vars(args) | {"repeats": 1}), device, modes[0])
    for compiled in modes:
        for s in steps:
            row = measure(model, s, args, device, compiled)
            print(table_row(row), flush=True)
            results.data["results"].append(row)
            results.row_done()
    results.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
