"""A playground for infilling: type text with gaps, pick a sampler, watch the model fill them.

    python tools/playground.py --ckpt RUN [--port 8000] [--host 127.0.0.1] [--weights ema|raw]
        [--device auto] [--dtype auto] [--tokenizer-file PATH]

Serves one page on http://127.0.0.1:PORT (this machine only, by default). In its text box,
[___] is a gap of as many tokens as underscores and [20] a gap of 20 tokens; text without a gap
is a prompt, continued up to the length asked. Pick the sampler (the paper's parallel sampler in
S calls, the exact speculative one drafting K positions ahead, or a planner that chooses the next
positions by confidence, margin, entropy or a threshold), the temperature and the seed, and the
samples are replayed call by call as tools/replay.py's page replays them. One model serves every
visitor: requests queue, and the page shows how many are ahead. Bad input (a gap past the
model's block, an unknown sampler) gets one line on the page.

To use it from another machine, forward the port over ssh (ssh -L 8000:127.0.0.1:8000 HOST, then
open http://127.0.0.1:8000 there), or pass --host 0.0.0.0 on a network you trust: the page has
no login, and anyone who reaches it makes the model work.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import re
import sys
import threading
import traceback
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from aogpt import UsageError, cli_entry
from aogpt.data_prep.synthetic import TokenIds
from aogpt.data_prep.tokenizer import load_gpt2
from aogpt.model import load_checkpoint
from aogpt.model.checkpoint import describe_provenance, locate_checkpoint, provenance
from aogpt.model.orders import ANY_ORDER, READING_WORDS
from aogpt.model.precision import reproducible_dtype, resolve_device
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, given_tokens, sample_records
from aogpt.model.sampler.ways import DEFAULT_SAMPLER, SAMPLERS, WAYS, Room, named
from aogpt.trainer.replay import Pieces, fill, page_data

PAGE = Path(__file__).with_name("playground.html")
GAP = re.compile(r"\[(_+|\d+)\]")  # [___]: as many tokens as underscores; [20]: 20 tokens
MAX_SAMPLES = 8  # per request
MAX_BODY = 1 << 20  # bytes of a request
KEPT_RESULTS = 64  # finished jobs kept for their pages to collect
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python tools/playground.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--port", type=int, default=8000, help="default 8000 (0: any free port)")
    add("--host", default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)")
    add("--ckpt", required=True, help="out_dir, checkpoint folder or model.safetensors")
    add("--weights", choices=("ema", "raw"), default="ema", help="default ema")
    add("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    add("--dtype", choices=("auto", *DTYPES), default="auto", help="auto: bf16 on a GPU, else fp32")
    add("--tokenizer-file", default=None, help="GPT-2 ranks file (offline tokenizer)")
    return parser.parse_args(argv)


# ---- a request: text with gaps and the sampler's settings -------------------------------------

@dataclass
class Request:
    """What a visitor asked for, checked: the given tokens of a sequence of seq_len positions, the
    sampler's settings and how many samples."""

    tokens: torch.Tensor  # (seq_len,) int64
    mask: torch.Tensor  # (seq_len,) bool: given positions
    config: SamplingConfig
    samples: int


def text_with_gaps(text: str, length: int | None, block: int, encoding) -> tuple[dict, int]:
    """The infill ({start: token ids}) and the sequence's length of text with [___] gaps; text
    without a gap is a prompt continued to `length` (default the block)."""
    infill, position = {}, 0
    pieces = GAP.split(text)  # text, gap, text, gap, ..., text
    for k, piece in enumerate(pieces):
        if k % 2:
            position += len(piece) if piece.startswith("_") else int(piece)
            continue
        ids = encoding.encode_ordinary(piece) if hasattr(encoding, "encode_ordinary") else (
            encoding.encode(piece))
        if ids:
            infill[position] = ids
        position += len(ids)
    if len(pieces) == 1:  # a prompt
        end = block if length is None else length
        if end <= position:
            raise UsageError(f"the prompt takes {position} tokens, not fewer than the length "
                             f"{end}: give a longer length, or a gap ([___])")
        position = end
    if position > block:
        raise UsageError(f"the text and its gaps take {position} tokens, past the model's block "
                         f"of {block}: shorten a gap or the text")
    if position == sum(map(len, infill.values())):
        raise UsageError("nothing to fill: put a gap in the text, [___] (3 tokens) or [20]")
    return infill, position


def settings_of(fields: dict, to_generate: int) -> SamplingConfig:
    """The sampler's settings the page sent, checked and fitted to the gaps by the ways' table
    (model/sampler/ways.py) as trainer/sample.py checks its flags: each way reads its own
    fields (steps, draft, reveal, threshold), the others are ignored."""
    sampler = fields.get("sampler") or DEFAULT_SAMPLER
    order = fields.get("planner") or ANY_ORDER.word
    if sampler not in SAMPLERS:
        raise UsageError(f"unknown sampler {sampler!r}: choose {' or '.join(SAMPLERS)}")
    fixed = order in READING_WORDS
    if not fixed and order not in WAYS:
        raise UsageError(f"unknown order {order!r}: choose {', '.join(READING_WORDS)} or a "
                         f"planner: {', '.join(named('planner'))}")
    if not fixed and sampler != DEFAULT_SAMPLER:
        raise UsageError(f"the {order} planner chooses positions call by call; the {sampler} "
                         "sampler works along an order fixed up front: choose one")
    way = WAYS[sampler if fixed else order]
    given = {option.field: number(fields, option.field, option.type) for option in way.options
             if option.type in (int, float) and fields.get(option.field) not in (None, "")}
    for name, value in given.items():
        next(option for option in way.options if option.field == name).check(value, name)
    config = SamplingConfig(**{way.picked_by: way.name}, **given,
                            order=order if fixed else ANY_ORDER.word,
                            temperature=number(fields, "temperature", float, 1.0),
                            top_p=number(fields, "top_p", float, 1.0),
                            seed=number(fields, "seed", int, 0))
    config.validate()
    return way.fit(config, set(given), Room(to_generate, to_generate))[0]


def number(fields: dict, name: str, kind: type, default=None):
    value = fields.get(name)
    if value in (None, ""):
        return default
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be {'an integer' if kind is int else 'a number'}, got "
                         f"{value!r}") from None


def read_request(fields, block: int, encoding) -> Request:
    if not isinstance(fields, dict) or not isinstance(fields.get("text"), str):
        raise UsageError("the request must be a JSON object with the text to fill")
    length = number(fields, "length", int, None)
    infill, seq_len = text_with_gaps(fields["text"], length, block, encoding)
    tokens, mask = given_tokens(seq_len, infill=infill)
    config = settings_of(fields, seq_len - int(mask.sum()))
    samples = number(fields, "samples", int, 1)
    if not 1 <= samples <= MAX_SAMPLES:
        raise UsageError(f"samples must be in 1..{MAX_SAMPLES}, got {samples}")
    return Request(tokens, mask, config, samples)


# ---- the model, one request at a time ---------------------------------------------------------

class Playground:
    """The model and a queue of requests that one worker thread samples in turn."""

    def __init__(self, model, encoding, origin: dict):
        self.model, self.encoding, self.origin = model, encoding, origin
        self.pieces = Pieces(encoding)
        self.block = model.config.block_size
        self.lock = threading.Condition()
        self.waiting: collections.deque[int] = collections.deque()
        self.requests: dict[int, Request] = {}
        self.results: collections.OrderedDict[int, dict] = collections.OrderedDict()
        self.running: int | None = None
        self.ids = itertools.count(1)
        threading.Thread(target=self.work, name="sampler", daemon=True).start()

    def submit(self, fields) -> dict:
        request = read_request(fields, self.block, self.encoding)  # bad input: raised at once
        with self.lock:
            job = next(self.ids)
            self.requests[job] = request
            self.waiting.append(job)
            self.lock.notify()
            return {"job": job, **self.status(job)}

    def status(self, job: int) -> dict:
        """Where a job is: queued (how many are ahead), running, done (its replay) or failed."""
        with self.lock:
            if job in self.results:
                return self.results[job]
            if job == self.running:
                return {"state": "running", "ahead": 0}
            if job in self.waiting:
                ahead = list(self.waiting).index(job) + (self.running is not None)
                return {"state": "queued", "ahead": ahead}
            return {"state": "unknown", "error": f"no request {job} here (the server keeps the "
                                                 f"last {KEPT_RESULTS} results)"}

    def work(self) -> None:
        finished: tuple[int, dict] | None = None
        while True:
            with self.lock:
                if finished is not None:
                    self.keep(*finished)
                # the next job starts in the same hold of the lock as the last one ends: a job
                # that waits always has one running ahead of it (never "0 requests ahead")
                self.running = None
                while not self.waiting:
                    self.lock.wait()
                job = self.running = self.waiting.popleft()
                request = self.requests.pop(job)
            finished = job, self.result_of(request)

    def keep(self, job: int, result: dict) -> None:
        """A job's result, among the last KEPT_RESULTS (the caller holds the lock)."""
        self.results[job] = result
        while len(self.results) > KEPT_RESULTS:
            self.results.popitem(last=False)

    def result_of(self, request: Request) -> dict:
        try:
            return {"state": "done", "replay": self.sample(request)}
        except UsageError as err:
            return {"state": "failed", "error": str(err)}
        except Exception as err:  # a bug: the page gets one line, the log the traceback
            traceback.print_exc()
            cause = (str(err).strip().splitlines() or [""])[0][:200]
            return {"state": "failed", "error": f"the sampler failed ({type(err).__name__}: "
                                                f"{cause}): the server's log has the trace"}

    @torch.no_grad()
    def sample(self, request: Request) -> dict:
        b, n = request.samples, len(request.tokens)
        sampler = KVCacheSampler(self.model, b, n, request.config)
        ids = torch.arange(b)
        out = sampler.generate(ids, request.tokens.expand(b, -1), request.mask.expand(b, -1),
                               record_calls=True)
        given = request.mask.nonzero().flatten().tolist()
        records = sample_records(ids.tolist(), out, self.encoding, request.config,
                                 given_positions=given, provenance=self.origin)
        return page_data(records, self.pieces)


# ---- HTTP ---------------------------------------------------------------------------------------

def handler(playground: Playground, page: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            job = re.fullmatch(r"/jobs/(\d+)", self.path)
            if self.path in ("/", "/index.html"):
                self.send(HTTPStatus.OK, page.encode(), "text/html; charset=utf-8")
            elif job:
                self.send_json(HTTPStatus.OK, playground.status(int(job[1])))
            else:
                self.send_json(HTTPStatus.NOT_FOUND, {"error": f"no page {self.path} here"})

        def do_POST(self):  # noqa: N802
            if self.path != "/jobs":
                return self.send_json(HTTPStatus.NOT_FOUND, {"error": f"no {self.path} here"})
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_BODY:
                return self.send_json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                      {"error": f"the request is over {MAX_BODY} bytes"})
            try:
                fields = json.loads(self.rfile.read(size) or b"null")
                self.send_json(HTTPStatus.ACCEPTED, playground.submit(fields))
            except json.JSONDecodeError as err:
                self.send_json(HTTPStatus.BAD_REQUEST, {"error": f"the request is not JSON "
                                                                 f"({err.msg})"})
            except UsageError as err:
                self.send_json(HTTPStatus.BAD_REQUEST, {"error": str(err)})

        def send_json(self, status: HTTPStatus, value: dict) -> None:
            self.send(status, json.dumps(value, separators=(",", ":")).encode(),
                      "application/json")

        def send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):  # noqa: A002 (the standard library's name)
            if self.command == "POST":  # not every poll of the page
                sys.stderr.write(f"{self.address_string()} {format % args}\n")

    return Handler


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    device = resolve_device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype != "auto" else reproducible_dtype(device)
    source = locate_checkpoint(args.ckpt)
    model = load_checkpoint(source.file, weights=args.weights, map_location=device).to(dtype)
    model.eval()
    encoding = load_gpt2(args.tokenizer_file) if model.config.reads_gpt2 else TokenIds()
    origin = provenance(source, args.weights, vars(args), made_by="tools/playground.py")
    try:
        server = ThreadingHTTPServer((args.host, args.port),
                                     handler(Playground(model, encoding, origin),
                                             fill(PAGE)))
    except OSError as err:
        raise UsageError(f"cannot listen on {args.host}:{args.port} ({err.strerror}): choose "
                         "another --port") from None
    host, port = server.server_address[:2]
    print(f"playground of {source.file} ({describe_provenance(origin)}) on http://{host}:{port}",
          flush=True)
    if host in ("127.0.0.1", "localhost", "::1"):
        print(f"  this machine only; from another one: ssh -L {port}:127.0.0.1:{port} THIS_HOST, "
              f"then open http://127.0.0.1:{port} there (or --host 0.0.0.0 on a trusted network)",
              flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
