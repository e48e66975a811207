"""Exports a checkpoint as a Hugging Face folder that loads with torch and transformers alone.

    python tools/export_hf.py --ckpt RUN_OR_FILE --out DIR [--weights ema|raw] [--force]

    model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)   # then, anywhere

DIR gets the weights, the modelling code (model/hf/remote_code.py copies it), GPT-2's tokenizer
and aogpt_export.json, the export's provenance and the files it wrote. What the folder holds, how
the model scores and generates (left to right, and in any order with the KV-cache sampler) and
how lm-evaluation-harness reads it: docs/export.md, "Hugging Face export".

The folder is written beside DIR and renamed into place: DIR is complete or absent. DIR may be
new or empty; --force replaces an earlier export only (a folder holding aogpt_export.json and no
file the export did not write). A training run's folder, or a folder of other files, is never
replaced.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import tiktoken
import torch

from aogpt import UsageError, cli_entry
from aogpt.data_prep.tokenizer import EOS, load_gpt2
from aogpt.files import (
    check_writable_folder,
    ordinary_permissions,
    staged_folder,
    write_json_atomic,
)
from aogpt.model import AOGPT, load_checkpoint
from aogpt.model.checkpoint import (
    CheckpointSource,
    locate_checkpoint,
    provenance,
    resolve_checkpoint_file,
)
from aogpt.model.config import GPT2_VOCAB
from aogpt.model.hf.remote_code import AUTO_MAP, write_remote_code
from aogpt.run_folder import check_not_a_run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True,
                        help="out_dir, checkpoint folder or consolidated model.pt")
    parser.add_argument("--out", required=True, type=Path, help="the folder to write")
    parser.add_argument("--weights", choices=("ema", "raw"), default="ema",
                        help="default ema (as the paper)")
    parser.add_argument("--force", action="store_true",
                        help="replace --out if it holds an earlier export (never other files)")
    parser.add_argument("--tokenizer-file", default=None,
                        help="GPT-2 ranks file (offline tokenizer)")
    return parser.parse_args(argv)


# ---- the tokenizer -------------------------------------------------------------------------------


def gpt2_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge that made each multi-byte token, in rank order: GPT-2's merges.txt.

    tiktoken's BPE merges the adjacent pair whose join has the lowest rank, so a token of rank r
    is what BPE over its own bytes reaches with the ranks below r: exactly two parts. Most
    tokens split into two lower-ranked tokens one way only, which is then that merge.
    """
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        splits = [(token[:i], token[i:]) for i in range(1, len(token))
                  if ranks.get(token[:i], rank) < rank and ranks.get(token[i:], rank) < rank]
        if len(splits) == 1:
            merges.append(splits[0])
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            joined = [ranks.get(a + b, rank) for a, b in zip(parts[:-1], parts[1:], strict=True)]
            i = min(range(len(joined)), key=joined.__getitem__)
            if joined[i] >= rank:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) != 2:
            raise RuntimeError(f"token {token!r} (rank {rank}) is no merge of two lower ranks")
        merges.append((parts[0], parts[1]))
    return merges


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as one printable character. The printable Latin-1
    bytes ('!'..'~', '\u00a1'..'\u00ac', '\u00ae'..'\u00ff') stand for themselves; the other 68
    take the characters from U+0100 on, in byte order. (transformers 5 no longer exports its
    copy of this table, so it is built here.)"""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def write_tokenizer(encoding: tiktoken.Encoding, dest: Path, model_max_length: int) -> None:
    """GPT-2's tokenizer files in transformers' byte-level form, from the tiktoken encoding."""
    from transformers import GPT2TokenizerFast  # seconds of imports: only an export pays them

    ranks = {token: encoding.encode_single_token(token) for token in encoding.token_byte_values()}
    as_text = byte_level_alphabet()  # byte-level BPE writes each byte as a printable character

    def text(token: bytes) -> str:
        return "".join(as_text[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()} | {"<|endoftext|>": EOS}
    (dest / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    merges = "".join(f"{text(a)} {text(b)}\n" for a, b in gpt2_merges(ranks))
    (dest / "merges.txt").write_text("#version: 0.2\n" + merges)
    tokenizer = GPT2TokenizerFast(vocab_file=str(dest / "vocab.json"),
                                  merges_file=str(dest / "merges.txt"),
                                  model_max_length=model_max_length)
    tokenizer.save_pretrained(dest)  # adds tokenizer.json and tokenizer_config.json


# ---- the model -----------------------------------------------------------------------------------


def write_model(model: AOGPT, dest: Path) -> None:
    """config.json (with auto_map), generation_config.json and model.safetensors."""
    # transformers takes seconds to import: --help and a refused --out answer without it
    from transformers import GenerationConfig

    from aogpt.model.hf.configuration_aogpt import AOGPTConfig
    from aogpt.model.hf.modeling_aogpt import AOGPTForCausalLM

    config = AOGPTConfig(**dataclasses.asdict(model.config))
    config.auto_map = AUTO_MAP
    with torch.device("meta"):  # its own weights are replaced by the checkpoint's
        hf_model = AOGPTForCausalLM(config)
    hf_model.aogpt = model
    # generate() never draws the padded ids >= GPT2_VOCAB, as sampler.py never does
    padded = list(range(GPT2_VOCAB, model.config.vocab_size)) or None
    hf_model.generation_config = GenerationConfig(bos_token_id=EOS, eos_token_id=EOS,
                                                  use_cache=False, suppress_tokens=padded)
    hf_model.save_pretrained(dest)


# ---- the folder ----------------------------------------------------------------------------------


MARKER = "aogpt_export.json"  # in every folder this tool writes: what --force may replace


def check_out(out: Path, source: CheckpointSource, force: bool) -> None:
    """UsageError unless `out` can take the export: new, empty, or (with --force) an earlier export
    of this tool holding nothing else. A training run, the checkpoint's own folder and a folder
    of other files are refused, with or without --force."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file: give a folder")
    if not out.is_dir() or not any(out.iterdir()):
        check_writable_folder(out.parent, f"--out {out}")
        return
    check_not_a_run(out, "--out", "give a new folder for the export; --force never replaces a run")
    if out.resolve() in source.file.resolve().parents:
        raise UsageError(f"--out {out} holds the checkpoint itself: write the export elsewhere")
    foreign = sorted(set(os.listdir(out)) - exported_files(out))
    if foreign:
        raise UsageError(f"--out {out} holds files this tool did not write there (e.g. "
                         f"{foreign[0]}; {len(foreign)} in all): give a new or empty folder; "
                         f"--force replaces only an earlier export of this tool (a folder whose "
                         f"{MARKER} lists every file in it)")
    if not force:
        raise UsageError(f"--out {out} holds an earlier export: pass --force to replace it, or "
                         "give a new folder")


def exported_files(folder: Path) -> set[str]:
    """The files an earlier export wrote in `folder`, as its marker lists them (none without a
    readable marker)."""
    try:
        return {MARKER, *json.loads((folder / MARKER).read_text())["files"]}
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return set()


def write_marker(folder: Path, source: CheckpointSource, weights: str,
                 tokenizer_file: str | None) -> None:
    """MARKER: the export's provenance and the files it wrote (written last, to list them all)."""
    record = {"made_by": "tools/export_hf.py",
              **provenance(source, weights, {"tokenizer_file": tokenizer_file}),
              "files": sorted(os.listdir(folder))}
    write_json_atomic(record, folder / MARKER)


def export(ckpt: str | os.PathLike, out: Path, weights: str = "ema", force: bool = False,
           tokenizer_file: str | None = None) -> AOGPT:
    """Writes the folder `out` (see the module's docstring); returns the exported model."""
    out = Path(out)
    source = locate_checkpoint(ckpt)
    check_out(out, source, force)
    model = load_checkpoint(source.file, weights=weights)
    encoding = load_gpt2(tokenizer_file)
    with staged_folder(out) as partial:
        write_model(model, partial)
        write_remote_code(partial)
        write_tokenizer(encoding, partial, model_max_length=model.config.block_size - 1)
        for path in partial.iterdir():  # safetensors makes its file readable by its owner only
            ordinary_permissions(path)
        write_marker(partial, source, weights, tokenizer_file)
    return model


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = export(args.ckpt, args.out, args.weights, args.force, args.tokenizer_file)
    c = model.config
    print(f"wrote {args.out}: {c.family}, {c.n_layer} layers x {c.n_embd}, "
          f"{model.num_params() / 1e6:.2f}M parameters, {args.weights} weights of "
          f"{resolve_checkpoint_file(args.ckpt)}")
    print(f"load: AutoModelForCausalLM.from_pretrained({str(args.out)!r}, trust_remote_code=True)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
