"""The replay page: one self-contained HTML file that replays samples network call by network call.

trainer/sample.py --html, tools/replay.py (a samples file made earlier, the trainer's in-training
samples included) and benchmarks/sudoku_planners.py --html write it. The page holds everything it
shows (its style, its script player.js, the data) and fetches nothing: its Content-Security-Policy
forbids any request. A sample is shown as a row of cells, one per position, the given tokens
marked; each call's revealed tokens appear at their positions. A record with its calls (sample.py
--record-calls: each call's positions made final, the speculative sampler's drafts and their
fate, a planner's candidates and their scores) replays the true calls; a record without them
replays one position at a time, in the order the sample was generated in.

The data the page embeds (page_data), as compact as it reads: token ids are indices into the
page's own vocabulary (`ids`: the model's ids it holds, `pieces`: each one's bytes, a string where
they are UTF-8 on their own, else a list of byte values; `join`: "bytes", a text is its tokens'
bytes decoded as UTF-8, or "words", its pieces joined by spaces, a synthetic language's ids).
Each sample:

    tokens    its final tokens (vocabulary indices), one per position
    given     the positions given before generation (a prompt, infill)
    order     the positions generated, in the order they were made final
    reveals   with calls recorded: how many entries of `order` each call made final
    events    with calls recorded, per call (0 when nothing else happened): d [position, token]
              drafted, a positions whose draft was accepted, r [position, token] drafts rejected
              (then redrawn), c [position, score] the planner's candidates, best first
    seams     where each window after the first began generating (a text past the block)
    wrong     the positions the verifier marks wrong (Sudoku)
    facts     [name, value] lines: the calls, acceptance, exact log-likelihood, settings, source
    label     what the sample picker says
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from aogpt import UsageError, check_input_file
from aogpt.files import html_provenance, write_text_atomic
from aogpt.model.sampler import SamplingConfig, way_of

SCORE_DIGITS = 4  # significant digits of a planner's candidate scores on the page
PAGE_FILES = Path(__file__).resolve().parent  # page.html, player.css, player.js


class Pieces:
    """What the page needs of a tokenizer: each token id's piece and how pieces join into text.
    GPT-2's (tiktoken) pieces are bytes; a synthetic language's text is its ids, spaced."""

    def __init__(self, encoding):
        self.piece_bytes = getattr(encoding, "decode_single_token_bytes", None)
        self.join = "bytes" if self.piece_bytes else "words"

    def piece(self, token: int) -> str | list[int]:
        if self.piece_bytes is None:
            return str(token)
        data = self.piece_bytes(token)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: its bytes
            return list(data)


def page_data(records: Sequence[dict], pieces: Pieces,
              grid: tuple[int, int, int, int] | None = None) -> dict:
    """The data of the page for these sample records (trainer/sample.py's, the trainer's, or
    records of that shape); grid (rows, cols, box_rows, box_cols) lays the cells out as a
    Sudoku grid."""
    ids = sorted({token for record in records for token in tokens_named(record)})
    local = {token: i for i, token in enumerate(ids)}
    data = {"join": pieces.join, "ids": ids, "pieces": [pieces.piece(t) for t in ids],
            "samples": [sample_view(record, local) for record in records]}
    if grid is not None:
        data["grid"] = list(grid)
    return data


def tokens_named(record: dict) -> set[int]:
    """Every token id the record holds: its final tokens, its drafts'."""
    found = set(record["tokens"])
    for call in record.get("calls", ()):
        found.update(token for _, token in (*call.get("drafts", ()), *call.get("rejected", ())))
    return found


def generation_order(record: dict) -> tuple[list[int], list[int]]:
    """(given positions, generated positions in the order generated). A record's order lists
    every position (the given first) or, past the block, the generated ones only."""
    n = len(record["tokens"])
    in_order = set(record["order"])
    given = set(record.get("given_positions") or ()) | (set(range(n)) - in_order)
    return sorted(given), [p for p in record["order"] if p not in given and p < n]


def sample_view(record: dict, local: dict[int, int]) -> dict:
    given, order = generation_order(record)
    view = {"tokens": [local[t] for t in record["tokens"]], "given": given, "order": order,
            **calls_view(record, order, local)}
    for key in ("seams", "wrong"):
        if record.get(key):
            view[key] = record[key]
    calls = len(view["reveals"]) if "reveals" in view else len(order)
    view["label"] = (f"{record.get('label') or 'sample ' + str(record['sample'])} · "
                     f"{len(record['tokens'])} tokens · {calls} "
                     f"{'calls' if 'reveals' in view else 'positions'}")
    view["facts"] = facts(record, len(given), len(order), "reveals" in view)
    return view


def calls_view(record: dict, order: list[int], local: dict[int, int]) -> dict:
    """The recorded calls as the page reads them (reveals, events); {} for a record without."""
    calls = record.get("calls")
    if calls is None:
        return {}
    made_final = [p for call in calls for p in call.get("final", ())]
    if made_final != order:
        raise UsageError(f"sample {record.get('sample')}: its recorded calls make final "
                         f"{len(made_final)} positions that are not its order's {len(order)}: "
                         "the record was edited or mixed with another sample's")
    events = [{key: value for key, value in (
        ("d", [[p, local[t]] for p, t in call.get("drafts", ())]),
        ("a", list(call.get("accepted", ()))),
        ("r", [[p, local[t]] for p, t in call.get("rejected", ())]),
        ("c", [[p, float(f"{score:.{SCORE_DIGITS}g}")] for p, score in call.get("candidates", ())]),
    ) if value} or 0 for call in calls]
    return {"reveals": [len(call.get("final", ())) for call in calls],
            **({"events": events} if any(events) else {})}


def facts(record: dict, given: int, generated: int, recorded: bool) -> list[list[str]]:
    """The lines under a sample: what made it and what it cost."""
    lines = [["tokens", f"{given + generated} ({given} given, {generated} generated)"]]
    if "network_calls" in record:
        batch = record.get("batch_network_calls")
        lines.append(["network calls", f"{record['network_calls']}"
                      + (f" (its batch: {batch})" if batch not in (None, record["network_calls"])
                         else "")])
    lines.append(["replayed", "its recorded calls" if recorded else
                  "one position at a time, in the order generated (calls were not recorded: "
                  "trainer/sample.py --record-calls records them)"])
    if record.get("drafts_decided"):
        decided, accepted = record["drafts_decided"], record["drafts_accepted"]
        lines.append(["drafts accepted", f"{accepted} of {decided} ({accepted / decided:.0%})"])
    if record.get("log_likelihood") is not None:
        ll = record["log_likelihood"]
        lines.append(["exact log-likelihood", f"{ll:.3f} nats ({ll / max(generated, 1):.4f} per "
                      "generated token) along the planner's order"])
    if record.get("stopped"):
        lines.append(["stopped", record["stopped"]])
    if record.get("seams"):
        lines.append(["window seams", ", ".join(map(str, record["seams"]))])
    if record.get("settings"):
        lines.append(["sampler", describe_settings(record["settings"])])
    for key, name in (("step", "training step"), ("weights", "weights")):
        if record.get(key) is not None:
            lines.append([name, str(record[key])])
    origin = record.get("provenance") or {}
    if origin.get("checkpoint"):
        lines.append(["checkpoint", f"{origin['checkpoint']} ({origin.get('tag')}, step "
                      f"{origin.get('step')}, {origin.get('weights')} weights)"])
    if record.get("time_s") is not None:
        lines.append(["batch time", f"{record['time_s']:.2f} s"])
    return lines


def describe_settings(settings: dict) -> str:
    """'speculative: draft 4 · order random · temperature 1.0 · seed 0' from a record's settings
    (the way they pick, model/sampler/ways.py, and the options it reads)."""
    try:
        config = SamplingConfig(**settings)
        way = way_of(config)
    except (TypeError, UsageError):  # a record of another version: its settings as they are
        return ", ".join(f"{name} {value}" for name, value in settings.items())
    read = [f"{option.field} {getattr(config, option.field)}" for option in way.options
            if getattr(config, option.field) is not None]
    draw = [f"order {config.order}", f"temperature {config.temperature}"]
    if config.top_p < 1.0:
        draw.append(f"top-p {config.top_p} ({config.top_p_rule} rule)")
    if config.top_k:
        draw.append(f"top-k {config.top_k}")
    return " · ".join([f"{way.name}: {', '.join(read)}" if read else way.name, *draw,
                       f"seed {config.seed}"])


def page_html(data: dict, title: str, about: str, origin: dict) -> str:
    """The page: page.html with player.css, player.js, the data and the provenance inlined."""
    return fill(PAGE_FILES / "page.html", title=html.escape(title), about=html.escape(about),
                data=script_json(data), provenance=html_provenance(origin))


def fill(template, **values: str) -> str:
    """A page template (a file) with each {{name}} replaced by its value; {{style}} and
    {{script}} are the player's (player.css, player.js)."""
    values = {"style": (PAGE_FILES / "player.css").read_text(encoding="utf-8"),
              "script": (PAGE_FILES / "player.js").read_text(encoding="utf-8"), **values}
    return re.sub(r"\{\{(\w+)\}\}", lambda found: values[found[1]],
                  template.read_text(encoding="utf-8"))


def script_json(value) -> str:
    """JSON that may stand inside a <script> element: no "<" (which could close it), no spaces
    the parser does not need."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).replace("<", "\\u003c")


def write_page(path: str | Path, records: Sequence[dict], pieces: Pieces, title: str,
               about: str, origin: dict,
               grid: tuple[int, int, int, int] | None = None) -> Path:
    """Writes the page of `records` to `path` (whole or not at all); origin is its provenance."""
    text = page_html(page_data(records, pieces, grid), title, about, origin)
    return write_text_atomic(path, text)


# ---- reading a samples file ------------------------------------------------------------------

RECORD_KEYS = ("tokens", "order", "text")
SAMPLES_EXPECTED = ("a samples file of trainer/sample.py --out, or of a run's samples/ folder "
                    "(one JSON object per line)")


def read_samples(path: str | Path, flag: str) -> list[dict]:
    """The sample records of a JSON Lines file, each checked to be a sample's (tokens, order,
    text); what is wrong is one line naming the file and line."""
    path = check_input_file(path, flag, SAMPLES_EXPECTED)
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{flag} {path} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(f"{where} is not JSON ({err.msg}): give {SAMPLES_EXPECTED}") from None
        check_record(record, where)
        records.append(record)
    if not records:
        raise UsageError(f"{flag} {path} holds no samples: give {SAMPLES_EXPECTED}")
    return records


def check_record(record, where: str) -> None:
    if not isinstance(record, dict) or any(key not in record for key in RECORD_KEYS):
        raise UsageError(f"{where} is not a sample record (it needs {', '.join(RECORD_KEYS)}): "
                         f"give {SAMPLES_EXPECTED}")
    tokens, order = record["tokens"], record["order"]
    if not all(isinstance(t, int) and t >= 0 for t in tokens):
        raise UsageError(f"{where}: tokens must be token ids (integers >= 0)")
    if (not all(isinstance(p, int) and 0 <= p < len(tokens) for p in order)
            or len(set(order)) != len(order)):
        raise UsageError(f"{where}: order must list distinct positions of its "
                         f"{len(tokens)} tokens")


def pieces_for(records: Sequence[dict], encodings: dict[str, Callable[[], object]],
               where: str):
    """The encoding whose decoding of every record's tokens is its text, of `encodings` (name ->
    a function that loads it), tried in turn; refused in one line when none is."""
    for load in encodings.values():
        encoding = load()
        if all(encoding.decode(record["tokens"]) == record["text"] for record in records):
            return Pieces(encoding)
    raise UsageError(f"{where}: the samples' texts are not their tokens decoded by "
                     f"{' or '.join(encodings)}: was the file edited?")
