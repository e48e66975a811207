"""Start AO-GPT from a left-to-right GPT (model.init_from): what the shapes share is copied, what
AO-GPT adds starts so that, at step 0, the network reads left to right exactly as the GPT did.

Sources: a local Hugging Face GPT-2 folder (config.json + model.safetensors, as save_pretrained
writes it) or a checkpoint of one of this project's left-to-right models (model.target_injection
none, e.g. the gpt_small preset). What is copied from GPT-2:

    token embedding (wte), position embedding, each block's LayerNorms, attention and MLP
    (GPT-2's Conv1D weights are transposed into nn.Linear's), the final LayerNorm, the head (GPT-2
    ties it to wte; ours gets its own copy)

and what AO-GPT adds starts as:

    the [None] slot     GPT-2's <|endoftext|> embedding: slot 0 reads as the EOS a GPT-2 document
                        starts after, at GPT-2's position 0; slot k holds token k-1 at GPT-2's
                        position k, so AO-GPT's left-to-right stream is GPT-2's forward on
                        [EOS, x_0, ..., x_{n-2}]
    AdaLN               weights 0, biases giving shift 0, scale 0 and gate 1: every block is GPT-2's
                        block whatever the target position, until training moves them
    target table        as initialised (its gradient flows once the AdaLN weights move)
    padded vocab rows   head weight 0 and bias -1e4: ids >= 50257 get no probability, so the
                        softmax is GPT-2's over its 50257 tokens

GPT-2's block is AO-GPT's with model.norm=layer, model.bias=true, model.qk_norm=false and
model.gelu=tanh (GPT-2's tanh approximation; the paper's AO-GPT uses the exact GELU); the
position table covers a block of n_positions - 1 tokens exactly (the [None] slot takes one row),
and rows past it start fresh. What a user gives up against the paper's AO-GPT: RMSNorm and the
qk-norm, which the paper trains with. The optimizer and the step count start fresh.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from aogpt import UsageError
from aogpt.model.config import GPT2_EOS, GPT2_VOCAB, ModelConfig
from aogpt.model.gpt import AOGPT

# Hugging Face's names of GPT-2's activation -> model.gelu (gelu_new is GPT-2's own, the tanh form)
HF_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "exact"}
PADDED_LOGIT = -1e4  # exp() of it is 0 in fp32 and bf16 next to logits of O(10)


def warm_start(model: AOGPT, source: str | Path) -> str:
    """Fills `model` (freshly initialised) from the GPT at `source`; returns what it was."""
    path = Path(source)
    if (path / "config.json").is_file():
        state, what = _hugging_face_gpt2(path, model.config)
    else:
        state, what = _our_left_to_right(path, model.config)
    own = model.state_dict()
    with torch.no_grad():
        for name, value in state.items():
            target = own[name]
            rows = min(len(value), len(target))  # position or vocabulary tables may differ
            target[:rows].copy_(value[:rows])
        _read_left_to_right(model, copied_vocab=state["transformer.wte.weight"].shape[0])
    return what


def check_source(source: str | Path, config: ModelConfig) -> None:
    """UsageError (one line) unless `source` can start this model: the trainer's preflight. A
    GPT-2 folder is checked by its config.json alone; a checkpoint of ours is loaded."""
    path = Path(source)
    if (path / "config.json").is_file():
        _check_hugging_face_gpt2(path, config)
    else:
        _our_left_to_right(path, config)


def _check_hugging_face_gpt2(path: Path, config: ModelConfig) -> list[Path]:
    """The weight files of a GPT-2 folder that fits `config`."""
    try:
        hf = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as err:
        raise UsageError(f"model.init_from: {path / 'config.json'} is not JSON ({err})") from None
    if hf.get("model_type") != "gpt2":
        raise UsageError(f"model.init_from: {path} holds a {hf.get('model_type') or 'unknown'} "
                         "model, not a Hugging Face GPT-2 (model_type gpt2)")
    if hf.get("vocab_size") != GPT2_VOCAB:
        raise UsageError(f"model.init_from: {path} has a vocabulary of {hf.get('vocab_size')} "
                         f"tokens, not GPT-2's {GPT2_VOCAB} (the data is GPT-2 BPE)")
    shape = {"n_layer": hf.get("n_layer"), "n_head": hf.get("n_head"), "n_embd": hf.get("n_embd")}
    ours = {name: getattr(config, name) for name in shape}
    if shape != ours:
        raise UsageError(f"model.init_from: {path} is a GPT-2 of {shape}, the model is {ours}: "
                         "set model.n_layer, n_head and n_embd to the GPT's")
    gelu = HF_GELU.get(hf.get("activation_function", "gelu_new"))
    if gelu is None:
        raise UsageError(f"model.init_from: {path} uses the activation "
                         f"{hf.get('activation_function')!r}, which AO-GPT's MLP does not have")
    block = {"norm": "layer", "bias": True, "qk_norm": False, "gelu": gelu}
    if {name: getattr(config, name) for name in block} != block:
        raise UsageError("model.init_from a GPT-2 needs GPT-2's block: set "
                         + " ".join(f"model.{k}={str(v).lower()}" for k, v in block.items()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UsageError(f"model.init_from: {path} holds no .safetensors weights (save the model "
                         "with save_pretrained(..., safe_serialization=True))")
    return files


def _hugging_face_gpt2(path: Path, config: ModelConfig) -> tuple[dict, str]:
    """GPT-2's tensors under our names (the head from wte, as GPT-2 ties them)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = _check_hugging_face_gpt2(path, config)
    try:
        tensors = {k.removeprefix("transformer."): v
                   for f in files for k, v in load_file(f).items()}
    except SafetensorError as err:
        raise UsageError(f"model.init_from: {files[0]} is not readable: {err}") from None
    state = {"transformer.wte.weight": tensors["wte.weight"],
             "transformer.wpe.weight": tensors["wpe.weight"],
             "transformer.wnonee.weight": tensors["wte.weight"][GPT2_EOS:GPT2_EOS + 1],
             "transformer.final_layer.ln_f.weight": tensors["ln_f.weight"],
             "transformer.final_layer.ln_f.bias": tensors["ln_f.bias"],
             "lm_head.weight": tensors.get("lm_head.weight", tensors["wte.weight"])}
    for i in range(config.n_layer):
        for ours_name, theirs_name, conv in (
                ("ln_1", "ln_1", False), ("ln_2", "ln_2", False),
                ("attn.c_attn", "attn.c_attn", True), ("attn.c_proj", "attn.c_proj", True),
                ("mlp.c_fc", "mlp.c_fc", True), ("mlp.c_proj", "mlp.c_proj", True)):
            weight = tensors[f"h.{i}.{theirs_name}.weight"]
            state[f"transformer.h.{i}.{ours_name}.weight"] = weight.T if conv else weight
            state[f"transformer.h.{i}.{ours_name}.bias"] = tensors[f"h.{i}.{theirs_name}.bias"]
    return state, f"Hugging Face GPT-2 {path}"


def _our_left_to_right(path: Path, config: ModelConfig) -> tuple[dict, str]:
    """The tensors of our left-to-right checkpoint that AO-GPT has too (all but AdaLN's)."""
    from aogpt.model.checkpoint import load_checkpoint

    try:
        gpt = load_checkpoint(path, weights="raw")
    except UsageError as err:
        raise UsageError(f"model.init_from: {path} is neither a Hugging Face GPT-2 folder (no "
                         f"config.json) nor a checkpoint of this project: {err}") from None
    if gpt.config.any_order:
        raise UsageError(f"model.init_from: {path} is a {gpt.config.family}, not a left-to-right "
                         "GPT (model.target_injection=none)")
    keep = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "norm", "qk_norm", "bias",
            "gelu", "lm_head_bias", "tie_embeddings")
    theirs = {name: getattr(gpt.config, name) for name in keep}
    ours = {name: getattr(config, name) for name in keep}
    if theirs != ours:
        differ = ", ".join(f"model.{k}={theirs[k]}" for k in keep if theirs[k] != ours[k])
        raise UsageError(f"model.init_from: {path} differs from the model in {differ}: set them")
    return gpt.state_dict(), f"left-to-right checkpoint {path}"


def _read_left_to_right(model: AOGPT, copied_vocab: int) -> None:
    """The parts AO-GPT adds, set so that the network computes what the GPT computed."""
    t, config = model.transformer, model.config
    config.injection.start_as_identity(t)
    if copied_vocab < config.vocab_size and not config.tie_embeddings:
        model.lm_head.weight[copied_vocab:].zero_()
        if model.lm_head.bias is not None:
            model.lm_head.bias[copied_vocab:].fill_(PADDED_LOGIT)
