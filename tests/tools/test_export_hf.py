"""tools/export_hf.py: the exported folder loads with torch and transformers alone and computes
what the project computes: left-to-right logits and loss, greedy generate(), any-order sampling
and the tokenizer. Each kind of network is trained briefly, exported, then read by one separate
process that cannot import aogpt. The folder records where it came from, and --force replaces an
earlier export only: never a training run, never other files."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, tool

import aogpt
from aogpt.data_prep.tokenizer import EOS, load_gpt2
from aogpt.model import AOGPT, load_checkpoint, save_consolidated
from aogpt.model.checkpoint import resolve_checkpoint_file
from aogpt.model.config import GPT2_VOCAB, ModelConfig, plain_gpt, sigma_gpt
from aogpt.model.sampler import KVCacheSampler, SamplingConfig

sys.path.insert(0, str(REPO / "tests" / "trainer"))  # the trainer tests' real data and tiny runs

TEXT = (
    "The city council met on Tuesday to discuss the new bridge over the river. Engineers said "
    "the old bridge, built in 1921, could no longer carry heavy trucks, and that repairs would "
    "cost more than a new one. Residents asked whether the work would close the road for the "
    "summer; the mayor said one lane would stay open. The vote is expected next month, after a "
    "second public hearing at the library."
)
TOKENIZER_TEXTS = [
    TEXT,
    "Café prices in Zürich rose 5 % — naïve visitors paid €4.50; 東京 and 😀 cost nothing.",
    "end of one document.<|endoftext|>The next one starts here, doesn't it? 1,234,567.89!",
    "  leading spaces,\ttabs,\n\n\nnew lines and trailing spaces   ",
    "'s 'll 'VE ’curly’ \u00a0non-breaking\u2028line separator\r\nCRLF",
]
COMMIT = r"[0-9a-f]{40}(\+dirty)?"  # git_sha()'s form; its value moves with each commit
BLOCK = 32
KINDS = {
    "ao_gpt": ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=BLOCK, cond_dim=8),
}
KINDS["sigma_gpt"] = sigma_gpt(KINDS["ao_gpt"])
KINDS["plain_gpt"] = plain_gpt(KINDS["ao_gpt"])
PAD = 5  # the second row behind this many pads
PROMPT_LENS, NEW_TOKENS = (8, 5), 12  # greedy: two prompts, the shorter left-padded
ANY_ORDER = {"num_samples": 3, "seq_len": 24, "steps": 5, "top_p": 0.9, "top_k": 100, "seed": 3}


def briefly_trained(config: ModelConfig, ids: torch.Tensor) -> tuple[AOGPT, AOGPT]:
    """The initial and the trained network: 20 AdamW steps on TEXT's first BLOCK tokens, in
    random orders and left to right alternately (left to right only for the plain GPT). AO-GPT
    and the GPT then continue TEXT's words, so greedy decoding compares real choices, not one
    repeated token (sigma-GPT learns slower and still repeats one)."""
    torch.manual_seed(0)
    model = AOGPT(config)
    initial = AOGPT(config)
    initial.load_state_dict(model.state_dict())
    window = ids[None, :BLOCK]
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    for step in range(20):
        orders = None
        if config.target_injection != "none" and step % 2:
            orders = torch.rand(window.shape).argsort(dim=1)
        _, loss = model(window, orders, return_mean=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return initial.eval(), model.eval()


CHILD = r"""
import importlib.abc, json, sys

class NoAogpt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "aogpt":
            raise ImportError(f"the exported folder imported {name}")

sys.meta_path.insert(0, NoAogpt())
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

def left_padded(rows, pad):
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    return {"input_ids": ids, "attention_mask": mask}

spec = json.load(open(sys.argv[1]))
results = {}
for name, job in spec["exports"].items():
    model = AutoModelForCausalLM.from_pretrained(job["dir"], trust_remote_code=True)
    rows, eos, new = job["ids"], job["eos"], job["new_tokens"]
    ids = torch.tensor(rows)
    out = {"logits": model(ids).logits, "loss": model(ids, labels=ids).loss.detach()}
    try:
        model(torch.zeros(1, model.config.block_size, dtype=torch.long))
    except ValueError as err:
        out["too_long"] = str(err)
    out["padded_logits"] = model(**left_padded([rows[0], rows[1][job["pad"]:]], eos)).logits
    # greedy on a left-padded batch with use_cache=True, as lm-eval's hf model calls generate()
    prompts = left_padded([row[:n] for row, n in zip(rows, job["prompt_lens"])], eos)
    out["greedy"] = model.generate(**prompts, do_sample=False, max_new_tokens=new,
                                   use_cache=True, pad_token_id=eos)
    torch.manual_seed(0)
    out["sampled"] = model.generate(ids[:1, :job["prompt_lens"][0]], max_new_tokens=new,
                                    do_sample=True, top_p=0.9, top_k=50)
    given = {int(start): tokens for start, tokens in job["given"].items()}
    generation = model.generate_any_order(given=given, **job["any_order"])
    out["any_order"] = (generation.tokens, generation.orders)
    results[name] = out
tokenizer_dir = next(iter(spec["exports"].values()))["dir"]
results["tokens"] = {}
for use_fast in (True, False):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, use_fast=use_fast)
    ids = [tokenizer.encode(text) for text in spec["texts"]]
    results["tokens"][use_fast] = (ids, [tokenizer.decode(i) for i in ids])
results["aogpt_modules"] = [m for m in sys.modules if m.split(".")[0] == "aogpt"]
torch.save(results, sys.argv[2])
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """For each kind: the project's model, the ids it was run on, and the child's results."""
    tmp = tmp_path_factory.mktemp("export_hf")
    encoding = load_gpt2()
    text_ids = torch.tensor(encoding.encode_ordinary(TEXT))
    ids = torch.stack([text_ids[:BLOCK], text_ids[BLOCK // 2:BLOCK // 2 + BLOCK]])  # (2, BLOCK)
    spec, projects = {"exports": {}, "texts": TOKENIZER_TEXTS}, {}
    for name, config in KINDS.items():
        initial, trained = briefly_trained(config, text_ids)
        save_consolidated(tmp / name, config, initial.state_dict(), trained.state_dict())
        assert tool("export_hf").main(["--ckpt", str(tmp / name),
                                       "--out", str(tmp / f"{name}_hf")]) == 0
        projects[name] = load_checkpoint(tmp / name).requires_grad_(False)
        any_order = dict(ANY_ORDER, order="random" if config.target_injection != "none" else "l2r")
        given = {0: ids[0, :4].tolist()}  # a prompt, and infilling where the kind allows it
        if config.target_injection != "none":
            given[16] = ids[0, 16:19].tolist()
        spec["exports"][name] = {"dir": str(tmp / f"{name}_hf"), "ids": ids[:, :-1].tolist(),
                                 "eos": EOS, "pad": PAD, "prompt_lens": PROMPT_LENS,
                                 "new_tokens": NEW_TOKENS, "given": given, "any_order": any_order}
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(tmp / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp / "spec.json"),
                            str(tmp / "out.pt")],
                           capture_output=True, text=True, cwd=tmp, env=env)
    assert child.returncode == 0, child.stderr[-3000:]
    return {"tmp": tmp, "ids": ids, "projects": projects, "spec": spec,
            "results": torch.load(tmp / "out.pt", weights_only=False)}


def test_the_folder_holds_config_weights_code_and_tokenizer(exported):
    folder = exported["tmp"] / "ao_gpt_hf"
    names = {path.name for path in folder.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "configuration_aogpt.py",
            "modeling_aogpt.py", "gpt.py", "sampler.py", "vocab.json", "merges.txt",
            "tokenizer.json", "tokenizer_config.json"} <= names
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_aogpt.AOGPTForCausalLM"
    assert config["target_injection"] == "adaln" and config["n_embd"] == 32
    assert not any(p.name.startswith(".") for p in folder.parent.iterdir())  # no partial folder
    assert len((folder / "merges.txt").read_text().splitlines()) == 1 + 50000  # GPT-2's merges


def test_the_child_never_imported_aogpt(exported):
    assert exported["results"]["aogpt_modules"] == []


def head_rounding(model: AOGPT, ids: torch.Tensor) -> float:
    """How far the head's logits may move when each n_embd-term dot product is summed in another
    order: n_embd * u * sum_i |h_i w_i| (Higham), u = 2^-24 in fp32, at its largest here."""
    with torch.no_grad():
        tokens, positions, target_positions, _ = model.training_stream(ids)
        hidden = model.forward_stream(tokens, positions, target_positions)
        products = hidden.abs() @ model.lm_head.weight.abs().T
    return float(model.config.n_embd * 2**-24 * products.max())


@pytest.mark.parametrize("kind", list(KINDS))
def test_left_to_right_logits_equal_the_projects(exported, kind):
    """logits[:, k] predicts token k + 1: the project's slot k + 1 (slot 0 is [None]). The child
    runs the same fp32 ops on the same slots, except that its head gets the slots after [None]
    only (t rows, not t + 1), which may sum each dot product in another order."""
    ids, project = exported["ids"], exported["projects"][kind]
    expected = project.logits(ids)[:, 1:]  # (2, BLOCK - 1, vocab)
    actual = exported["results"][kind]["logits"]
    assert actual.shape == expected.shape and actual.dtype == torch.float32
    torch.testing.assert_close(actual, expected, rtol=0, atol=head_rounding(project, ids))


@pytest.mark.parametrize("kind", list(KINDS))
def test_labels_give_the_shifted_cross_entropy(exported, kind):
    """loss = mean cross-entropy of logits[:, k] against labels[:, k + 1], made here from the
    project's logits. Cross-entropy moves by at most twice the largest change of a logit, which
    the head's rounding bounds (above). (The reference is torch's cross-entropy, not the
    project's NLL: in fp32 on a CPU it sums the 50304 exponentials less accurately than the
    project's chunked loss does, by up to ~1e-4 per token.)"""
    ids, project = exported["ids"], exported["projects"][kind]
    logits = project.logits(ids)[:, 1:-1]  # slot k predicts ids[:, k]
    expected = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:-1].flatten())
    torch.testing.assert_close(exported["results"][kind]["loss"], expected, rtol=0,
                               atol=2 * head_rounding(project, ids))


def test_inputs_longer_than_block_size_less_one_are_refused(exported):
    """t tokens take t + 1 slots, [None] first: the model reads BLOCK - 1 tokens at most (as the
    config's max_position_embeddings says, which lm-eval reads as the context length)."""
    assert "32 tokens exceed the model's 31" in exported["results"]["ao_gpt"]["too_long"]
    config = json.loads((exported["tmp"] / "ao_gpt_hf" / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == BLOCK - 1


@pytest.mark.parametrize("kind", list(KINDS))
def test_left_padding_changes_no_logit(exported, kind):
    """A row behind PAD pads computes what it computes alone: the pads are hidden from every
    slot and the real tokens keep positions 0.. . With a mask, attention runs another kernel
    that sums in another order in every layer: each result moves by a few ulps, the logits by
    O(10) ulps of their size through 2 layers and the head. 16 ulps of the largest logit."""
    ids = exported["ids"]
    expected = exported["projects"][kind].logits(ids[1:, PAD:])[:, 1:]
    padded = exported["results"][kind]["padded_logits"]
    tolerance = float(16 * torch.finfo(torch.float32).eps * expected.abs().max())
    torch.testing.assert_close(padded[1:, PAD:], expected, rtol=0, atol=tolerance)
    unpadded = exported["results"][kind]["logits"][:1]  # the first row, in the same batch
    torch.testing.assert_close(padded[:1], unpadded, rtol=0, atol=tolerance)


def greedy_continuation(model: AOGPT, prompt: torch.Tensor) -> list[int]:
    """NEW_TOKENS tokens after prompt from the project's sampler, left to right and greedy, up
    to the first end of text (where generate() stops)."""
    n = len(prompt) + NEW_TOKENS
    sampler = KVCacheSampler(model, 1, n, SamplingConfig(steps=NEW_TOKENS, order="l2r",
                                                         temperature=0))
    given = torch.zeros(1, n, dtype=torch.long)
    given[0, :len(prompt)] = prompt
    mask = torch.arange(n)[None] < len(prompt)
    continuation = sampler.generate(torch.arange(1), given, mask).tokens[0, len(prompt):].tolist()
    return continuation[:continuation.index(EOS) + 1] if EOS in continuation else continuation


@pytest.mark.parametrize("kind", list(KINDS))
def test_greedy_generate_continues_like_the_projects_sampler(exported, kind):
    """A batch of two prompts, the second left-padded: each row continues as the project's
    KV-cache sampler does alone. (Its one-row steps round differently from generate()'s full
    forwards, by ~1e-6; greedy choices of these trained models are far apart.)"""
    greedy = exported["results"][kind]["greedy"]  # (2, longest prompt + NEW_TOKENS), left-padded
    for row, ids, n in zip(greedy, exported["ids"], PROMPT_LENS, strict=True):
        prompt, row = ids[:n], row[max(PROMPT_LENS) - n:]
        assert torch.equal(row[:n], prompt)
        expected = greedy_continuation(exported["projects"][kind], prompt)
        assert row[n:n + len(expected)].tolist() == expected


@pytest.mark.parametrize("kind", list(KINDS))
def test_sampled_generate_draws_real_vocabulary_ids(exported, kind):
    sampled, n = exported["results"][kind]["sampled"][0], PROMPT_LENS[0]
    assert n < len(sampled) <= n + NEW_TOKENS  # shorter if it drew the end of text
    assert torch.equal(sampled[:n], exported["ids"][0, :n])
    assert sampled.max() < GPT2_VOCAB  # the padded ids are suppressed, as in the sampler


@pytest.mark.parametrize("kind", list(KINDS))
def test_any_order_generation_equals_the_kv_cache_sampler(exported, kind):
    """The same sampler code on the same weights: the same draws, token for token."""
    job = exported["spec"]["exports"][kind]
    settings = dict(job["any_order"])
    num_samples, n = settings.pop("num_samples"), settings.pop("seq_len")
    given = torch.zeros(num_samples, n, dtype=torch.long)
    mask = torch.zeros(num_samples, n, dtype=torch.bool)
    for start, tokens in job["given"].items():
        span = slice(int(start), int(start) + len(tokens))
        given[:, span], mask[:, span] = torch.tensor(tokens), True
    sampler = KVCacheSampler(exported["projects"][kind], num_samples, n, SamplingConfig(**settings))
    expected = sampler.generate(torch.arange(num_samples), given, mask)
    tokens, orders = exported["results"][kind]["any_order"]
    assert torch.equal(tokens, expected.tokens) and torch.equal(orders, expected.orders)
    assert torch.equal(tokens[mask], given[mask])


@pytest.mark.parametrize("use_fast", [True, False])
def test_the_tokenizer_encodes_and_decodes_like_tiktoken(exported, use_fast):
    encoding = load_gpt2()
    ids, decoded = exported["results"]["tokens"][use_fast]
    for text, actual, back in zip(TOKENIZER_TEXTS, ids, decoded, strict=True):
        assert actual == encoding.encode(text, allowed_special="all"), text
        assert back == text
    assert EOS in ids[2]  # "<|endoftext|>" is the one special token


def test_raw_weights_are_exported_when_asked(exported, tmp_path):
    from safetensors.torch import load_file

    ckpt = exported["tmp"] / "ao_gpt"
    assert tool("export_hf").main(["--ckpt", str(ckpt), "--out", str(tmp_path / "raw"),
                                 "--weights", "raw"]) == 0
    saved = load_file(tmp_path / "raw" / "model.safetensors")
    raw = load_checkpoint(ckpt, weights="raw").state_dict()
    assert saved.keys() == {f"aogpt.{name}" for name in raw}
    assert all(torch.equal(saved[f"aogpt.{name}"], tensor) for name, tensor in raw.items())


# ---- bad input -----------------------------------------------------------------------------------


def one_line_error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_missing_checkpoint_is_one_line_and_exit_2(tmp_path, capsys):
    assert tool("export_hf").main(["--ckpt", str(tmp_path / "nowhere"),
                                 "--out", str(tmp_path / "out")]) == 2
    assert "no checkpoint" in one_line_error(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", ["foreign", "garbage"])
def test_a_file_of_unknown_format_is_one_line_and_exit_2(tmp_path, capsys, content):
    if content == "foreign":  # a torch file, not ours
        torch.save({"model": {}}, tmp_path / "model.pt")
    else:
        (tmp_path / "model.pt").write_text("not a checkpoint")
    assert tool("export_hf").main(["--ckpt", str(tmp_path / "model.pt"),
                                 "--out", str(tmp_path / "out")]) == 2
    assert re.search(r"not an? (readable )?aogpt", one_line_error(capsys))
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_file_with_the_wrong_hash_is_one_line_and_exit_2(exported, tmp_path, capsys):
    ranks = tmp_path / "gpt2.tiktoken"
    ranks.write_text("IQ== 0\n")  # a ranks file, but not GPT-2's
    ckpt = exported["tmp"] / "ao_gpt"
    assert tool("export_hf").main(["--ckpt", str(ckpt), "--out", str(tmp_path / "out"),
                                 "--tokenizer-file", str(ranks)]) == 2
    assert "not GPT-2's" in one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_the_folder_records_where_it_came_from_and_what_it_wrote(exported):
    folder = exported["tmp"] / "ao_gpt_hf"
    record = json.loads((folder / "aogpt_export.json").read_text())
    assert record["made_by"] == "tools/export_hf.py"
    read = exported["tmp"] / "ao_gpt" / "model.safetensors"
    assert (record["checkpoint"], record["tag"], record["step"], record["weights"]) == (
        str(read.resolve()), None, None, "ema")  # a bare folder, saved without a step
    assert record["aogpt_version"] == aogpt.__version__ and re.fullmatch(COMMIT, record["git_sha"])
    assert record["files"] == sorted(p.name for p in folder.iterdir()
                                     if p.name != "aogpt_export.json")


def files_of(folder) -> dict:
    """Every file under `folder` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def training_run(finished_run):
    """A real run folder (trainer/main.py, 6 steps of the tiny model, a checkpoint every 3)."""
    return finished_run[0]


def test_a_training_run_is_never_replaced_even_with_force(training_run, tmp_path):
    """--out a run by mistake (here with other weights) deleted the run; it is refused now."""
    other = shutil.copytree(training_run / "final", tmp_path / "other_weights")
    before = files_of(training_run)
    assert {"config.yaml", "metrics.jsonl", "final/model.safetensors",
            "checkpoints/step_00000006/model.safetensors"} <= set(before)
    done = subprocess.run([sys.executable, "-X", "importtime", "tools/export_hf.py", "--ckpt",
                           str(other), "--out", str(training_run), "--force"],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2
    imported = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert [line for line in done.stderr.splitlines() if line not in imported] == [
        f"error: --out {training_run} is a training run (it holds config.yaml, metrics.jsonl, "
        "checkpoints/): give a new folder for the export; --force never replaces a run"]
    # the refusal comes before transformers' seconds of imports, which only an export needs
    assert imported and not any(" transformers" in line for line in imported)
    assert files_of(training_run) == before
    assert not any(p.name.startswith(".") for p in training_run.parent.iterdir())


def test_a_folder_of_other_files_is_refused_even_with_force(exported, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert tool("export_hf").main(["--ckpt", str(exported["tmp"] / "plain_gpt"), "--out", str(out),
                                 "--force"]) == 2
    assert one_line_error(capsys) == (
        f"error: --out {out} holds files this tool did not write there (e.g. notes.txt; 1 in "
        "all): give a new or empty folder; --force replaces only an earlier export of this tool "
        "(a folder whose aogpt_export.json lists every file in it)")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_an_earlier_export_is_replaced_only_with_force_and_only_as_it_was_written(
        exported, tmp_path, capsys):
    out = shutil.copytree(exported["tmp"] / "plain_gpt_hf", tmp_path / "out")
    ckpt = str(exported["tmp"] / "plain_gpt")
    assert tool("export_hf").main(["--ckpt", ckpt, "--out", str(out)]) == 2
    assert one_line_error(capsys) == (f"error: --out {out} holds an earlier export: pass --force "
                                      "to replace it, or give a new folder")
    assert tool("export_hf").main(["--ckpt", ckpt, "--out", str(out), "--force"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no partial or old folder left
    (out / "notes.txt").write_text("mine")  # the user's file among the export's
    assert tool("export_hf").main(["--ckpt", ckpt, "--out", str(out), "--force"]) == 2
    assert "(e.g. notes.txt; 1 in all)" in one_line_error(capsys)
    assert (out / "notes.txt").read_text() == "mine"


def test_the_checkpoint_folder_itself_is_never_replaced(exported, capsys):
    ckpt = exported["tmp"] / "plain_gpt"
    folder = resolve_checkpoint_file(ckpt).parent
    files = sorted(folder.iterdir())
    assert tool("export_hf").main(["--ckpt", str(ckpt), "--out", str(folder), "--force"]) == 2
    assert "holds the checkpoint" in one_line_error(capsys)
    assert sorted(folder.iterdir()) == files


def test_a_failed_export_leaves_the_old_folder_and_no_partial_one(exported, tmp_path, monkeypatch):
    out = shutil.copytree(exported["tmp"] / "plain_gpt_hf", tmp_path / "out")  # an earlier export
    before = files_of(out)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tool("export_hf"), "write_tokenizer", disk_full)
    with pytest.raises(OSError, match="No space"):
        tool("export_hf").export(exported["tmp"] / "plain_gpt", out, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert files_of(out) == before


def test_the_byte_level_alphabet_is_gpt2s():
    """Built here since transformers 5 no longer exports it (the H200 image's transformers):
    equal to the table transformers 4 ships, where it is importable."""
    tokenization_gpt2 = pytest.importorskip("transformers.models.gpt2.tokenization_gpt2")
    if not hasattr(tokenization_gpt2, "bytes_to_unicode"):
        pytest.skip("this transformers has no bytes_to_unicode to compare with")
    assert tool("export_hf").byte_level_alphabet() == tokenization_gpt2.bytes_to_unicode()
