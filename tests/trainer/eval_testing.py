"""Helpers for the evaluation tests: small real data folders made by data_prep, tiny checkpoints."""

import json
import random
from pathlib import Path

import numpy as np
import torch
from conftest import SHARED_DATA
from vocabulary_testing import variant_config

from aogpt.data_prep.eval_to_mds import main as eval_to_mds
from aogpt.data_prep.streaming_compat import release_shared_memory, streaming
from aogpt.model import AOGPT, save_consolidated
from aogpt.model.config import ModelConfig

SEQ_LEN = 16
WIKITEXT = SHARED_DATA / "wikitext-2" / "valid.txt"
_WORDS = "the lobster lives in 2 @,@ 000 m deep , eats ( small ) fish , is \" blue \" .".split()


def wikitext_lines(count: int = 120) -> list[str]:
    """The first lines of WikiText-2's validation text, or WikiText-like lines where it is
    absent."""
    if WIKITEXT.is_file():
        return WIKITEXT.read_text().splitlines(keepends=True)[:count]
    rng = random.Random(0)
    lines = []
    for article in range(count // 8):
        lines += [" \n", f" = Article {article} = \n", " \n"]
        lines += [" " + " ".join(rng.choices(_WORDS, k=rng.randint(5, 40))) + " \n"
                  for _ in range(5)]
    return lines


def build_wikitext(folder: Path, seq_len: int = SEQ_LEN, lines: int = 120) -> Path:
    """An eval set (data_prep/eval_to_mds.py, concat packing) of a little WikiText-2."""
    source = folder.parent / f"{folder.name}.valid.txt"
    source.write_text("".join(wikitext_lines(lines)))
    assert eval_to_mds(["--dataset", "wikitext2", "--source", str(source), "--out", str(folder),
                        "--seq-len", str(seq_len), "--workers", "1"]) == 0
    return folder


def build_lambada(folder: Path, seq_len: int = 48) -> Path:
    """LAMBADA-like passages, one per sample padded with EOS (--packing per_example)."""
    rng = random.Random(1)
    words = "Anna looked at her brother Tom and said that the dog was hungry again".split()
    passages = [" ".join(rng.choices(words, k=rng.randint(4, 20))) + " Tom" for _ in range(9)]
    source = folder.parent / f"{folder.name}.test.jsonl"
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in passages))
    assert eval_to_mds(["--dataset", "lambada", "--source", str(source), "--out", str(folder),
                        "--seq-len", str(seq_len), "--packing", "per_example",
                        "--workers", "1"]) == 0
    return folder


def read_folder(folder: Path) -> dict[str, np.ndarray]:
    """Every column of every sample, in order, read back by streaming: {column: (samples, ...)}."""
    dataset = streaming.StreamingDataset(local=str(folder), remote=None, shuffle=False,
                                         batch_size=1)
    samples = [dataset[i] for i in range(dataset.size)]
    release_shared_memory(dataset)
    return {name: np.stack([s[name] for s in samples]) for name in samples[0]}


def tiny_config(kind: str = "adaln", block_size: int = 48) -> ModelConfig:
    base = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=block_size, cond_dim=8)
    return variant_config(base, kind)


def tiny_model(kind: str = "adaln", seed: int = 0, block_size: int = 48) -> AOGPT:
    """A tiny model whose predictions depend visibly on the context and the order."""
    torch.manual_seed(seed)
    model = AOGPT(tiny_config(kind, block_size)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "adaLN" in name or "wtpe" in name or "wpe" in name:
                p.mul_(20)  # targets and positions should matter, not just the unigram head
    return model


def save_checkpoint(folder: Path, kind: str = "adaln", ema: bool = True) -> Path:
    """A consolidated checkpoint of tiny_model(kind); its EMA weights are the raw ones perturbed."""
    model = tiny_model(kind)
    raw = model.state_dict()
    generator = torch.Generator().manual_seed(2)
    ema_weights = {name: w + 0.05 * torch.randn(w.shape, generator=generator)
                   for name, w in raw.items()} if ema else None
    save_consolidated(folder, model.config, raw, ema_weights, step=1, source="test")
    return folder
