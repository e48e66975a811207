"""trainer/evaluate.py: the command, every checkpoint kind, one or two processes, what it read,
bad input refused before any scoring."""

import functools
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, UNWRITABLE_FILES, run_cli, unwritable_file
from eval_testing import build_wikitext, read_folder, save_checkpoint, wikitext_lines
from vocabulary_testing import DECODER_VARIANTS

import aogpt
from aogpt.data_prep.owt_to_mds import main as owt_to_mds
from aogpt.model import AOGPT, load_checkpoint, save_consolidated
from aogpt.model.checkpoint import locate_checkpoint, model_config_from_dict, read_consolidated
from aogpt.model.config import ModelConfig
from aogpt.model.official import convert_official
from aogpt.model.sampler import KVCacheSampler, SamplingConfig
from aogpt.run_folder import RunFolder, tag_for
from aogpt.trainer.dist_env import free_port
from aogpt.trainer.evaluate import main
from aogpt.trainer.evaluation import EvalData

EVALUATE = str(REPO / "trainer" / "evaluate.py")
COMMIT = r"[0-9a-f]{40}(\+dirty)?"  # git_sha()'s form; its value moves with each commit


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_cli")
    return {"data": build_wikitext(root / "wikitext2"),
            **{kind: save_checkpoint(root / kind, kind) for kind in DECODER_VARIANTS},
            "raw_only": save_checkpoint(root / "raw_only", ema=False)}


@pytest.fixture
def evaluate(run_main):
    """evaluate.py's main in this process: (exit status, stdout, stderr)."""
    return functools.partial(run_main, main)


def results(path) -> dict:
    return json.loads(path.read_text())["results"][0]


def test_command_prints_a_table_and_writes_the_json(folders, tmp_path):
    """... and never loads DeepSpeed (-X importtime lists every module the run imported): it
    reads its rank from the launcher's environment (trainer/dist_env.py)."""
    out = tmp_path / "result.json"
    done = run_cli("-X", "importtime", EVALUATE, "--ckpt", str(folders["adaln"]), "--data",
                   str(folders["data"]), "--num-orders", "2", "--ensemble", "1,2",
                   "--max-samples", "3", "--batch-size", "2", "--json", str(out))
    assert done.returncode == 0, done.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")]
    assert "torch" in imported and "aogpt.trainer.dist_env" in imported
    assert not [name for name in imported if name.split(".")[0] == "deepspeed"]
    for text in ("l2r", "random x2", "ensemble M=1", "ensemble M=2", "token-forwards",
                 "precision fp32", "AO-GPT"):
        assert text in done.stdout
    report = json.loads(out.read_text())
    assert report["precision"] == "fp32" and "TF32 off" in report["precision_policy"]
    assert report["weights"] == "ema" and report["model"]["target_injection"] == "adaln"
    result = report["results"][0]
    assert (result["dataset"], result["samples"], result["seq_len"]) == ("wikitext2", 3, 16)
    for kind in ("l2r", "random"):
        assert set(result[kind]) >= {"nll", "ppl", "tokens", "forwards", "token_forwards", "wall_s"}
        assert result[kind]["tokens"] == 3 * 16
    assert result["random"]["num_orders"] == 2 and result["random"]["nll_std"] > 0
    ensemble = result["ensemble"]
    assert set(ensemble["by_members"]) == {"1", "2"}
    assert ensemble["paper_token_forwards"] == 3 * (1 + 16) * (16 + 1)
    assert ensemble["token_forwards"] < ensemble["paper_token_forwards"]
    assert not list(tmp_path.glob(".*partial*"))  # written atomically


def test_two_processes_give_the_one_process_result(folders, tmp_path, evaluate):
    args = ["--ckpt", str(folders["adaln"]), "--data", str(folders["data"]), "--num-orders", "2",
            "--ensemble", "1,3", "--ensemble-targets", "6", "--max-samples", "5",
            "--batch-size", "2"]
    assert evaluate(*args, "--json", tmp_path / "one.json")[0] == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = run_cli("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                   str(free_port()), EVALUATE, *args, "--json", str(tmp_path / "two.json"), env=env)
    assert done.returncode == 0, done.stderr
    one, two = results(tmp_path / "one.json"), results(tmp_path / "two.json")
    assert json.loads((tmp_path / "two.json").read_text())["world_size"] == 2
    for kind in ("l2r", "random", "ensemble"):
        for key in ("tokens", "forwards", "token_forwards"):
            if (kind, key) != ("ensemble", "token_forwards"):  # its padding depends on the batches
                assert one[kind][key] == two[kind][key], (kind, key)
    # Two ranks batch other samples together: each token's fp32 NLL (~10.9, ulp ~1e-6) may move
    # by an ulp or two, so a mean by at most ~2e-7 relative (sums are float64). The standard
    # error is a spread: per-unit errors d ~ 2e-6 move it by ~d / (the units' NLL spread, ~0.3),
    # ~1e-5 relative (measured here: 2e-8), so rel=1e-3. A wrong merge of the ranks' sums (a
    # variance averaged instead of summed, a sample twice) moves them by O(1).
    assert one["l2r"]["nll"] == pytest.approx(two["l2r"]["nll"], rel=1e-6)
    assert one["random"]["nll_per_order"] == pytest.approx(two["random"]["nll_per_order"], rel=1e-6)
    for m in ("1", "3"):
        ensembles = one["ensemble"]["by_members"][m], two["ensemble"]["by_members"][m]
        assert ensembles[0]["nll"] == pytest.approx(ensembles[1]["nll"], rel=1e-6)
        assert ensembles[0]["nll_se"] == pytest.approx(ensembles[1]["nll_se"], rel=1e-3)


def test_sigma_gpt_is_scored_in_every_order_kind(folders, tmp_path, evaluate):
    code, out, _ = evaluate("--ckpt", folders["sigma_sum"], "--data", folders["data"],
                            "--ensemble", "2", "--max-samples", "2", "--json", tmp_path / "r.json")
    assert code == 0 and "sigma-GPT" in out
    assert {"l2r", "random", "ensemble"} <= set(results(tmp_path / "r.json"))


def test_planners_score_each_text_along_the_order_they_take(folders, tmp_path, evaluate):
    code, out, _ = evaluate("--ckpt", folders["adaln"], "--data", folders["data"], "--orders",
                            "l2r", "--planners", "margin,threshold", "--max-samples", "2",
                            "--batch-size", "2", "--json", tmp_path / "r.json")
    assert code == 0 and "planner margin" in out and "planner threshold" in out
    scored = results(tmp_path / "r.json")
    margin = scored["planner margin"]
    assert margin["likelihood"] == "exact" and margin["tokens"] == scored["l2r"]["tokens"]
    # the same texts through the sampler's teacher forcing: the same likelihood
    model = load_checkpoint(locate_checkpoint(folders["adaln"]).file, weights="ema")
    data = EvalData(folders["data"], model.config.block_size, max_samples=2)
    (sample_indices, idx, lengths), = data.batches(0, 1, 2)
    sampler = KVCacheSampler(model, 2, idx.size(1), SamplingConfig(planner="margin"))
    with torch.no_grad():
        forced = sampler.generate(sample_indices, forced_tokens=idx)
    expected = -forced.stats["log_likelihood"].sum().item() / lengths.sum().item()
    assert margin["nll"] == pytest.approx(expected, rel=1e-9)
    assert margin["network_calls"] == forced.sample_calls.sum().item()


def without_wall_times(value):
    if isinstance(value, list):
        return [without_wall_times(v) for v in value]
    if isinstance(value, dict):
        return {k: without_wall_times(v) for k, v in value.items() if k != "wall_s"}
    return value


@pytest.mark.parametrize("aliases", [("ltr", "uniform", "any"), ("left_to_right", "ao", "l2r")])
def test_order_aliases_give_the_scores_and_keys_of_the_words(folders, tmp_path, evaluate,
                                                             aliases):
    def scored(name, orders, base):
        out = tmp_path / f"{name}.json"
        assert evaluate("--ckpt", folders["adaln"], "--data", folders["data"], "--orders", orders,
                        "--ensemble", "2", "--ensemble-base", base, "--num-orders", "2",
                        "--max-samples", "2", "--json", out)[0] == 0
        report = json.loads(out.read_text())
        return report["settings"], without_wall_times(report["results"])

    words = scored("words", "l2r,random", "random" if aliases[2] == "any" else "l2r")
    assert scored("aliases", f"{aliases[0]},{aliases[1]}", aliases[2]) == words
    assert words[0]["orders"] == ["l2r", "random"]


def test_left_to_right_gpt_is_scored_left_to_right_by_default(folders, tmp_path, evaluate):
    code, out, _ = evaluate("--ckpt", folders["none"], "--data", folders["data"],
                            "--max-samples", "2", "--json", tmp_path / "r.json")
    result = results(tmp_path / "r.json")
    assert code == 0 and "l2r" in result and "random" not in result


def test_ema_and_raw_weights_are_both_available(folders, tmp_path, evaluate):
    for weights in ("ema", "raw"):
        assert evaluate("--ckpt", folders["adaln"], "--data", folders["data"], "--orders", "l2r",
                        "--max-samples", "2", "--weights", weights,
                        "--json", tmp_path / f"{weights}.json")[0] == 0
    ema, raw = (results(tmp_path / f"{w}.json")["l2r"]["nll"] for w in ("ema", "raw"))
    assert ema != raw


def test_training_out_dir_is_read_through_its_final_weights(folders, tmp_path, evaluate):
    shutil.copytree(folders["adaln"], tmp_path / "run" / "final")
    code, _, _ = evaluate("--ckpt", tmp_path / "run", "--data", folders["data"], "--orders", "l2r",
                          "--max-samples", "2", "--json", tmp_path / "r.json")
    assert code == 0 and results(tmp_path / "r.json")["l2r"]["tokens"] == 2 * 16


def test_imported_paper_checkpoint_is_scored_with_its_ema_weights(folders, tmp_path, evaluate):
    torch.manual_seed(0)
    args = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, bias=True, vocab_size=50304,
                dropout=0.0)
    raw, ema = AOGPT(ModelConfig(**args)), AOGPT(ModelConfig(**args))  # cond_dim 128, as the paper
    official = {"model": {f"module._orig_mod.{k}": v for k, v in raw.state_dict().items()},
                "model_args": args, "iter_num": 7,
                "ema_model": {"decay": 0.9999, "num_updates": 7,
                              "shadow_params": [p.detach() for p in ema.parameters()]}}
    config, raw_weights, ema_weights, meta = convert_official(official, source="test")
    save_consolidated(tmp_path / "imported", config, raw_weights, ema_weights, **meta)
    code, _, err = evaluate("--ckpt", tmp_path / "imported", "--data", folders["data"],
                            "--orders", "l2r", "--max-samples", "2", "--json", tmp_path / "r.json")
    assert code == 0, err
    idx = torch.from_numpy(read_folder(folders["data"])["tokens"][:2].astype("int64"))
    with torch.no_grad():  # a float64 mean, as the evaluator's (fp32 sums in a CPU's order)
        expected = ema.eval()(idx).double().mean().item()
    assert results(tmp_path / "r.json")["l2r"]["nll"] == pytest.approx(expected, rel=1e-6)


def test_compressed_pretraining_folder_is_scored_on_its_val_split(folders, tmp_path, evaluate):
    text = "".join(wikitext_lines(400))
    documents = [doc for doc in text.split(" \n = ") if doc.strip()]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in documents))
    data = tmp_path / "owt"
    assert owt_to_mds(["--source", str(source), "--out", str(data), "--seq-len", "16",
                       "--val-fraction", "0.5", "--workers", "1", "--compression", "zstd"]) == 0
    val_samples = json.loads((data / "manifest.json").read_text())["splits"]["val"]["samples"]
    code, _, err = evaluate("--ckpt", folders["adaln"], "--data", data, "--orders", "l2r",
                            "--json", tmp_path / "r.json")
    assert code == 0, err
    result = results(tmp_path / "r.json")
    assert (result["split"], result["samples"]) == ("val", val_samples)
    assert result["l2r"]["tokens"] == val_samples * 16


def _other_tokenizer(folders, tmp_path):
    data = shutil.copytree(folders["data"], tmp_path / "other")
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["tokenizer"] = {"name": "cl100k_base", "ranks_sha256": "0" * 64}
    (data / "manifest.json").write_text(json.dumps(manifest))
    return ["--ckpt", folders["adaln"], "--data", data]


BAD_INPUTS = {
    "missing checkpoint": (lambda f, t: ["--ckpt", t / "nothing", "--data", f["data"]],
                           "no checkpoint at"),
    "missing data": (lambda f, t: ["--ckpt", f["adaln"], "--data", t / "nothing"],
                     "does not exist"),
    "data of another tokenizer": (_other_tokenizer, "tokenized with 'cl100k_base'"),
    "ensemble size zero": (lambda f, t: ["--ckpt", f["adaln"], "--data", f["data"],
                                         "--ensemble", "0,2"], "--ensemble values must be >= 1"),
    "ensemble size not a number": (lambda f, t: ["--ckpt", f["adaln"], "--data", f["data"],
                                                 "--ensemble", "2,four"],
                                   "--ensemble takes a comma list of whole numbers"),
    "random orders on a left-to-right GPT": (
        lambda f, t: ["--ckpt", f["none"], "--data", f["data"], "--orders", "l2r,random"],
        "left-to-right GPT"),
    "ensemble on a left-to-right GPT": (
        lambda f, t: ["--ckpt", f["none"], "--data", f["data"], "--ensemble", "2"],
        "cannot score other orders"),
    "unknown order kind": (lambda f, t: ["--ckpt", f["adaln"], "--data", f["data"],
                                         "--orders", "l2r,reverse"],
                           "--orders: 'reverse' names no order: use l2r (also ltr, left_to_right) "
                           "or random (also uniform, ao, any, any_order)"),
    "no EMA in the checkpoint": (lambda f, t: ["--ckpt", f["raw_only"], "--data", f["data"]],
                                 'weights="raw"'),
    "zero orders": (lambda f, t: ["--ckpt", f["adaln"], "--data", f["data"], "--num-orders", "0"],
                    "--num-orders must be at least 1"),
    "unknown planner": (lambda f, t: ["--ckpt", f["adaln"], "--data", f["data"], "--planners",
                                      "margin,sideways"],
                        "--planners sideways: each must be one of confidence, margin, entropy, "
                        "threshold"),
    "one ensemble target": (lambda f, t: ["--ckpt", f["adaln"], "--data", f["data"], "--ensemble",
                                          "2", "--ensemble-targets", "1"],
                            "--ensemble-targets must be at least 2"),
    "a planner twice": (lambda f, t: ["--ckpt", f["adaln"], "--data", f["data"], "--planners",
                                      "margin,margin"],
                        "--planners margin,margin: margin is given twice (each is run once)"),
    "an order twice, by two names": (lambda f, t: ["--ckpt", f["adaln"], "--data", f["data"],
                                                   "--orders", "l2r,random,ltr"],
                                     "--orders l2r,random,ltr: l2r is given twice"),
    "an ensemble size twice": (lambda f, t: ["--ckpt", f["adaln"], "--data", f["data"],
                                             "--ensemble", "1,2,2"],
                               "--ensemble 1,2,2: 2 is given twice"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_refused_with_one_line(case, folders, tmp_path, evaluate):
    make_args, message = BAD_INPUTS[case]
    code, out, err = evaluate(*make_args(folders, tmp_path))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert out == ""


def test_data_longer_than_the_model_block_is_refused(folders, tmp_path, evaluate):
    data = build_wikitext(tmp_path / "long", seq_len=64)  # tiny models have block_size 48
    code, _, err = evaluate("--ckpt", folders["adaln"], "--data", data)
    assert code == 2 and "more than the model's block_size 48" in err


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--ckpt", "--data", "--orders", "--num-orders", "--ensemble", "--ensemble-targets",
                 "--weights", "--json", "--batch-size", "--max-samples", "--seed", "--precision",
                 "--unigram-from"):
        assert flag in out


def test_unigram_reference_scores_the_training_split_token_frequencies(folders, tmp_path, evaluate):
    text = "".join(wikitext_lines(300))
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": doc}) + "\n"
                              for doc in text.split(" \n = ") if doc.strip()))
    pretrain = tmp_path / "owt"
    assert owt_to_mds(["--source", str(source), "--out", str(pretrain), "--seq-len", "16",
                       "--val-fraction", "0.3", "--workers", "1"]) == 0
    code, out, err = evaluate("--ckpt", folders["adaln"], "--data", folders["data"], "--orders",
                              "l2r", "--unigram-from", pretrain, "--json", tmp_path / "r.json")
    assert code == 0, err
    assert "unigram (ref)" in out
    counts = np.bincount(read_folder(pretrain / "train")["tokens"].ravel(), minlength=50257) + 0.5
    tokens = read_folder(folders["data"])["tokens"].ravel()
    expected = -np.log(counts[tokens] / counts.sum()).mean()
    unigram = results(tmp_path / "r.json")["unigram"]
    assert unigram["nll"] == pytest.approx(expected, rel=1e-9)
    assert unigram["tokens"] == tokens.size


def test_unigram_reference_needs_a_pretraining_folder(folders, evaluate):
    code, _, err = evaluate("--ckpt", folders["adaln"], "--data", folders["data"],
                            "--unigram-from", folders["data"])
    assert code == 2 and "needs a pretraining folder" in err


# ---- outputs, provenance, progress ---------------------------------------------------------------


def test_an_existing_json_is_replaced_only_with_force_and_only_an_earlier_report(folders, tmp_path,
                                                                                evaluate):
    out = tmp_path / "eval.json"
    out.write_text("my earlier results")
    args = ["--ckpt", folders["adaln"], "--data", folders["data"], "--orders", "l2r",
            "--max-samples", "2", "--json", out]
    code, printed, err = evaluate(*args, "--force")
    assert (code, printed) == (2, "")  # refused before any scoring
    assert err == (f"error: --json {out} is a file that trainer/evaluate.py did not write: choose "
                   "another name (--force replaces only an earlier evaluation report of "
                   "trainer/evaluate.py)\n")
    assert out.read_text() == "my earlier results"
    out.unlink()
    assert evaluate(*args)[0] == 0
    assert json.loads(out.read_text())["provenance"]["made_by"] == "trainer/evaluate.py"
    code, printed, err = evaluate(*args)
    assert (code, printed) == (2, "") and err == (
        f"error: --json {out} holds an earlier evaluation report of trainer/evaluate.py: pass "
        "--force to replace it, or choose another name\n")
    assert evaluate(*args, "--force")[0] == 0
    assert results(out)["l2r"]["tokens"] == 2 * 16


@pytest.mark.parametrize("case", UNWRITABLE_FILES)
def test_a_json_that_cannot_be_written_is_refused_before_scoring(folders, tmp_path, evaluate, case):
    out = unwritable_file(tmp_path, case, "eval.json")
    code, printed, err = evaluate("--ckpt", folders["adaln"], "--data", folders["data"],
                                  "--json", out)
    assert (code, printed, err.count("\n")) == (2, "", 1) and UNWRITABLE_FILES[case] in err, err


def test_a_data_folder_with_an_empty_val_split_is_one_line(folders, tmp_path, evaluate, capsys):
    source = tmp_path / "one.jsonl"
    source.write_text(json.dumps({"text": "".join(wikitext_lines(40))}) + "\n")
    data = tmp_path / "owt"  # one document: it lands in train, val holds no sample
    assert owt_to_mds(["--source", str(source), "--out", str(data), "--seq-len", "16",
                       "--val-fraction", "0.0001", "--workers", "1"]) == 0
    capsys.readouterr()  # what building it printed
    code, printed, err = evaluate("--ckpt", folders["adaln"], "--data", data)
    assert (code, printed) == (2, "")
    assert err == (f"error: --data {data}: its val split holds no samples, so there is nothing "
                   "to score: rebuild the folder from more text, or for a pretraining folder "
                   "with a larger --val-fraction\n")


def test_an_unfinished_run_is_scored_through_its_latest_checkpoint_and_says_so(folders, tmp_path,
                                                                              evaluate):
    run = RunFolder(tmp_path / "run")  # as the trainer leaves it before final/
    ckpt = read_consolidated(folders["adaln"])
    save_consolidated(run.tag_dir(tag_for(4)), model_config_from_dict(ckpt["model_config"]),
                      ckpt["weights"]["raw"], ckpt["weights"]["ema"], step=4)
    run.latest_file.write_text(tag_for(4))
    code, printed, err = evaluate("--ckpt", run.root, "--data", folders["data"], "--orders", "l2r",
                                  "--max-samples", "2", "--json", tmp_path / "r.json")
    read = run.tag_dir(tag_for(4)) / "model.safetensors"
    assert code == 0, err
    assert err.splitlines()[0] == (f"note: {run.root} has no final/ (the run has not finished): "
                                   f"reading its latest checkpoint, {tag_for(4)}")
    assert printed.startswith(f"evaluating {read} ({tag_for(4)}, step 4): AO-GPT")
    origin = json.loads((tmp_path / "r.json").read_text())["provenance"]
    assert (origin["checkpoint"], origin["tag"], origin["step"], origin["unfinished_run"]) == (
        str(read.resolve()), tag_for(4), 4, True)


def test_the_json_records_the_checkpoint_read_the_settings_and_the_code(folders, tmp_path,
                                                                      evaluate):
    shutil.copytree(folders["adaln"], tmp_path / "run" / "final")
    assert evaluate("--ckpt", tmp_path / "run", "--data", folders["data"], "--orders", "l2r",
                    "--max-samples", "2", "--weights", "raw", "--json", tmp_path / "r.json")[0] == 0
    origin = json.loads((tmp_path / "r.json").read_text())["provenance"]
    read = tmp_path / "run" / "final" / "model.safetensors"
    assert (origin["checkpoint"], origin["tag"], origin["step"], origin["weights"]) == (
        str(read.resolve()), "final", 1, "raw")
    assert not origin["unfinished_run"]
    assert origin["settings"]["ckpt"] == str(tmp_path / "run")
    assert origin["settings"]["data"] == [str(folders["data"])]
    assert origin["settings"]["max_samples"] == 2 and origin["settings"]["orders"] == "l2r"
    assert origin["aogpt_version"] == aogpt.__version__ and re.fullmatch(COMMIT, origin["git_sha"])
    assert origin["created"]


def test_progress_written_to_a_log_file_has_no_carriage_returns(folders, tmp_path):
    """A SLURM or nohup log is a file: plain lines, not a terminal's redrawn bar."""
    log = tmp_path / "eval.log"
    with log.open("w") as sink:
        done = subprocess.run([sys.executable, EVALUATE, "--ckpt", str(folders["adaln"]),
                               "--data", str(folders["data"]), "--orders", "l2r",
                               "--max-samples", "4", "--batch-size", "2"],
                              cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text and "wikitext2: 2/2 batch (100%)" in text
