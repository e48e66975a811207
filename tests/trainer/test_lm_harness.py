"""The lm-evaluation-harness model "aogpt" (trainer/lm_harness.py) returns the model's own scores.

Local tasks (YAML + jsonl in a temporary folder, lm-eval's `--include_path`) run through lm-eval's
real command line, offline, and through its evaluator in this process; every answer is compared
with the checkpoint scored directly in float64: -log p along the identity order (AOGPT.forward),
the ensemble members' distributions by full forwards in the orders trainer/evaluation.py defines
(as the paper's script computes them), greedy decoding by full forwards.

Tolerances follow from the arithmetic. lm-eval's side runs in fp32: the per-token NLL of this
tiny model (~10.8 nats, one fp32 ulp ~1e-6) is then off the float64 one by at most 1.3e-6
(measured over 384 tokens: ~1.4 ulp), whatever the batch and padding. A sum over n tokens is thus
within n x 4e-6 (4 ulp per token, all of one sign, a bound none reaches). A real mistake (a token
scored without its context, or with one token of context too many) moves that token's NLL by
0.13 on average (at least 4e-4 measured), far beyond.

lm-eval's built-in `hf` model, unchanged, runs the same tasks on tools/export_hf.py's folder of the
same checkpoint (the last tests), through lm-eval's evaluator in this process, its samples written
and read back as the command line's are: where both read the same tokens it gives the same numbers.
"""

import ast
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, tool
from eval_testing import save_checkpoint

lm_eval = pytest.importorskip("lm_eval")

from aogpt import UsageError  # noqa: E402
from aogpt.data_prep.tokenizer import EOS, load_gpt2  # noqa: E402
from aogpt.model import load_checkpoint  # noqa: E402
from aogpt.model.config import GPT2_VOCAB  # noqa: E402
from aogpt.trainer.ensemble import member_orders  # noqa: E402
from aogpt.trainer.lm_harness import AOGPTLM, context_key  # noqa: E402

TASKS = ("tiny_lambada", "tiny_rolling", "tiny_generate")
BLOCK = 48  # tiny_config's block_size
PER_TOKEN = 4e-6  # fp32 vs float64 per-token NLL, see the module docstring
WORDS = "Anna looked at her brother Tom and said that the dog was hungry again".split()
PASSAGES = [  # LAMBADA-like: the last word is the target; the first is longer than the block
    " ".join(WORDS * 4) + " Tom",
    "The dog was hungry and Anna said Tom",
    "Tom said that Anna was hungry",
]
DOCUMENTS = [" ".join(WORDS[3 * i % len(WORDS)] for i in range(100)) + ".",  # 3 windows
             "Short text here."]
PROMPTS = ["Anna looked at her brother", "The dog"]
NEW_TOKENS = 6


def write_task(folder, name, rows, body):
    """A task of lm-eval reading local jsonl rows (its datasets cache in the folder too)."""
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"  cache_dir: {folder / 'datasets'}\ntest_split: test\n{body}")


# ---- the references: the checkpoint scored directly ------------------------------------------

@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("lm_harness_ckpt"))


@pytest.fixture(scope="module")
def model64(ckpt):
    return load_checkpoint(ckpt).double()  # EMA weights, the default of both sides


@pytest.fixture(scope="module")
def encoding():
    return load_gpt2()


def nll64(model64, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model64(torch.tensor([tokens]))[0]


def greedy_tokens(model64, prompt: list[int], count: int) -> list[int]:
    """Greedy decoding by full forwards: the slot after the prompt is read with a dummy token,
    which causal attention keeps out of every prediction before it."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(count):
            logits = model64.logits(torch.tensor([tokens + [0]]))[0, -1, :GPT2_VOCAB]
            tokens.append(int(logits.argmax()))
    return tokens[len(prompt):]


def continuation_split(encoding, context: str, continuation: str) -> tuple[list[int], int]:
    """lm-eval's tokenization of a (context, continuation) pair: the whole text's tokens, of
    which those after the context's own are the continuation's."""
    whole = encoding.encode_ordinary(context + continuation)
    return whole, len(whole) - len(encoding.encode_ordinary(context))


def rolling_reference(model64, tokens: list[int], prefix: tuple[int, ...] = ()) -> float:
    """log p(text) in lm-eval's rolling windows: the first BLOCK - 1 tokens from the [None] slot
    on (after the prefix tokens, themselves not scored), then chunks of BLOCK - 1, each read in
    the window of BLOCK tokens that ends with it."""
    chunk = BLOCK - 1
    total = first_window(model64, tokens, prefix)
    for start in range(chunk, len(tokens), chunk):
        end = min(start + chunk, len(tokens))
        total -= nll64(model64, tokens[end - BLOCK:end])[start - end:].sum().item()
    return total


def first_window(model64, tokens: list[int], prefix: tuple[int, ...] = ()) -> float:
    """log p of the first BLOCK - 1 tokens (or fewer, the whole text) read after the prefix."""
    row = [*prefix, *tokens[:BLOCK - 1]]
    return -nll64(model64, row)[len(prefix):].sum().item()


def mixture_log_probs(model64, context: list[int], members: int) -> torch.Tensor:
    """log of the members' mean distribution of the token after `context` (the whole padded
    vocabulary), from full forwards in each member's order, as the paper's script runs them (the
    slot after the context holds a dummy token, which no prediction before it sees)."""
    n = len(context) + 1
    idx, base = torch.tensor([context + [0]]), torch.arange(n)[None]
    key, target = torch.tensor([context_key(context)]), torch.full((1,), n - 1)
    with torch.no_grad():
        return torch.stack([
            model64.logits(idx, member_orders(base, key, target, torch.full((1,), m), 0, n))
            [0, -1].log_softmax(-1) for m in range(members)]).logsumexp(0) \
            - math.log(members)


def ensemble_reference(model64, row: list[int], scored: int, members: int) -> tuple[float, bool]:
    """The context-order ensemble's log p of the last `scored` tokens of `row`, and whether each
    of them is the argmax of the members' mean distribution."""
    log_p, greedy = 0.0, True
    for target in range(len(row) - scored, len(row)):
        mixture = mixture_log_probs(model64, row[:target], members)
        log_p += mixture[row[target]].item()
        greedy &= int(mixture[:GPT2_VOCAB].argmax()) == row[target]
    return log_p, greedy


# ---- lm-eval's command line, once for all three request types ---------------------------------

@pytest.fixture(scope="module")
def tasks(tmp_path_factory, model64, encoding):
    folder = tmp_path_factory.mktemp("lm_harness_tasks")
    write_task(folder, "tiny_lambada", [{"text": text} for text in PASSAGES],
               "output_type: loglikelihood\n"
               "doc_to_text: \"{{text.split(' ')[:-1]|join(' ')}}\"\n"
               "doc_to_target: \"{{' '+text.split(' ')[-1]}}\"\n"
               "metric_list:\n  - metric: perplexity\n    aggregation: perplexity\n"
               "    higher_is_better: false\n  - metric: acc\n    aggregation: mean\n"
               "    higher_is_better: true\n")
    write_task(folder, "tiny_rolling", [{"text": text} for text in DOCUMENTS],
               "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\n"
               "doc_to_target: \"{{text}}\"\nmetric_list:\n  - metric: word_perplexity\n"
               "  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    write_task(folder, "tiny_generate", [{"prompt": p, "answer": "-"} for p in PROMPTS],
               "output_type: generate_until\ndoc_to_text: \"{{prompt}}\"\n"
               "doc_to_target: \"{{answer}}\"\n"
               f"generation_kwargs:\n  until: {json.dumps(['zzz', stop_string(model64, encoding)])}"
               f"\n  max_gen_toks: {NEW_TOKENS}\n  do_sample: false\n"
               "metric_list:\n  - metric: exact_match\n")
    return folder


def stop_string(model64, encoding) -> str:
    """A word that the first prompt's greedy continuation reaches after a few tokens and the
    second one's never does: the first answer is cut there, the second runs to max_gen_toks."""
    first, second = (encoding.decode(greedy_tokens(model64, encoding.encode_ordinary(p),
                                                   NEW_TOKENS))
                     for p in PROMPTS)
    for word in re.findall(r"[A-Za-z]{3,}", first)[1:]:
        if word not in second:
            return word
    raise AssertionError(f"no usable stop word in {first!r} (vs {second!r})")


@pytest.fixture(scope="module", autouse=True)
def cli_run(tasks, ckpt, tmp_path_factory):
    """lm-eval's command line on the three tasks, started before this module's first test so that
    it runs beside the in-process ones (it spends ~20 s reading lm-eval's own task files)."""
    out = tmp_path_factory.mktemp("lm_harness_out")
    process = start_lm_eval("aogpt.trainer.lm_harness", "aogpt", f"ckpt={ckpt},batch_size=2",
                            tasks, out)
    yield process, out / "results"
    process.kill()
    process.communicate()


def offline(out: Path) -> dict[str, str]:
    """The environment of lm-eval's runs: offline, Hugging Face's caches under `out`."""
    return {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(out / "hf")}


def start_lm_eval(module: str, model: str, model_args: str, tasks: Path, out: Path
                  ) -> subprocess.Popen:
    """lm-eval's command line (`python -m module`), offline, on the three local tasks."""
    return subprocess.Popen(
        [sys.executable, "-m", module, "--model", model, "--model_args", model_args,
         "--device", "cpu", "--batch_size", "2", "--tasks", ",".join(TASKS),
         "--include_path", str(tasks),
         "--output_path", str(out / "results"), "--log_samples"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, **offline(out)})


@pytest.fixture(scope="module")
def cli_samples(cli_run):
    return finished_run(*cli_run)


def finished_run(process: subprocess.Popen, results: Path) -> tuple[dict, dict]:
    """The samples of each task, by doc_id, and the aggregate results of an lm-eval run."""
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return written_run(results)


def written_run(results: Path) -> tuple[dict, dict]:
    """The samples of each task, by doc_id, and the aggregate results in lm-eval's output folder
    (the samples' resps as it writes them: numbers and booleans as strings)."""
    samples = {}
    for name in TASKS:
        (path,) = results.rglob(f"samples_{name}_*.jsonl")
        samples[name] = sorted((json.loads(line) for line in path.open()),
                               key=lambda s: s["doc_id"])
    (path,) = results.rglob("results_*.json")
    return samples, json.loads(path.read_text())["results"]


# ---- the ensemble, through lm-eval's evaluator in this process ---------------------------------

def test_ensemble_scores_are_the_papers_context_order_ensemble(tasks, ckpt, model64, encoding):
    from lm_eval.api.instance import Instance
    from lm_eval.tasks import TaskManager

    members = 3
    results = lm_eval.simple_evaluate(
        model="aogpt", model_args={"ckpt": str(ckpt), "order": f"ensemble:{members}"},
        tasks=["tiny_lambada"], device="cpu", batch_size=2, log_samples=True,
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False))
    samples = sorted(results["samples"]["tiny_lambada"], key=lambda s: s["doc_id"])
    for sample, text in zip(samples, PASSAGES, strict=True):
        context, target = text.rsplit(" ", 1)
        whole, scored = continuation_split(encoding, context, " " + target)
        expected, greedy = ensemble_reference(model64, whole[-BLOCK:], scored, members)
        log_p, is_greedy = sample["resps"][0][0]
        assert float(log_p) == pytest.approx(expected, rel=0, abs=scored * PER_TOKEN)
        assert str(is_greedy) == str(greedy)
    # a text that fits one window: every token scored, the first from the [None] slot alone
    lm = AOGPTLM(ckpt=str(ckpt), order=f"ensemble:{members}", device="cpu")
    (log_p,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (DOCUMENTS[1],), 0)])
    tokens = encoding.encode_ordinary(DOCUMENTS[1])
    expected, _ = ensemble_reference(model64, tokens, len(tokens), members)
    assert log_p == pytest.approx(expected, rel=0, abs=len(tokens) * PER_TOKEN)


@pytest.mark.parametrize("order, members", [("l2r", 1), ("ensemble:3", 3)])
def test_is_greedy_holds_for_the_argmax_continuation_only(ckpt, model64, order, members):
    lm = AOGPTLM(ckpt=str(ckpt), order=order, device="cpu")
    context = [464, 3290, 373, 14720, 290]  # "The dog was hungry and"
    winner = int(mixture_log_probs(model64, context, members)[:GPT2_VOCAB].argmax())
    answers = lm._loglikelihood_tokens([(("", ""), context, [winner]),
                                        (("", ""), context, [(winner + 1) % GPT2_VOCAB])])
    assert [is_greedy for _, is_greedy in answers] == [True, False]


@pytest.mark.parametrize("alias", ["ltr", "left_to_right"])
def test_a_left_to_right_alias_scores_as_l2r(ckpt, alias):
    context, continuation = [464, 3290, 373], [14720, 290]  # "The dog was" "hungry and"
    scores = [AOGPTLM.create_from_arg_string(f"ckpt={ckpt},order={order}", {"device": "cpu"})
              ._loglikelihood_tokens([(("", ""), context, continuation)])
              for order in ("l2r", alias)]
    assert scores[0] == scores[1]


def test_bf16_generation_samples_with_bf16_weights(ckpt, encoding):
    """The sampler's KV cache holds the weights' dtype: bf16 runs a bf16 copy, not autocast."""
    from lm_eval.api.instance import Instance

    lm = AOGPTLM(ckpt=str(ckpt), precision="bf16", device="cpu")
    request = Instance("generate_until", {}, ("The dog", {"until": ["zzz"], "max_gen_toks": 4}), 0)
    (text,) = lm.generate_until([request])
    assert len(encoding.encode_ordinary(text)) in range(2, 7)  # 4 tokens, re-encoded
    assert lm.model.lm_head.weight.dtype == torch.float32  # scoring keeps fp32 weights


def test_speculative_generation_gives_the_greedy_tokens_of_one_token_per_call(ckpt):
    """draft=K: the same distribution as one token per call, so under greedy the same text."""
    from lm_eval.api.instance import Instance

    requests = [Instance("generate_until", {}, (context, {"until": ["zzz"], "max_gen_toks": 12}),
                         number) for number, context in enumerate(["The dog", "A", ""])]
    one_per_call = AOGPTLM(ckpt=str(ckpt), device="cpu").generate_until(requests)
    drafted = AOGPTLM(ckpt=str(ckpt), device="cpu", draft=4).generate_until(requests)
    assert drafted == one_per_call


# ---- bad input: one line each ------------------------------------------------------------------

@pytest.mark.parametrize("model_args, message", [
    ("order=ensemble", "order='ensemble': give l2r (also ltr, left_to_right) or ensemble:M"),
    ("order=ensemble:0", "order='ensemble:0': give l2r (also ltr, left_to_right) or ensemble:M"),
    ("order=reverse", "order='reverse': give l2r (also ltr, left_to_right) or ensemble:M"),
    ("order=random", "order='random': lm-eval's tasks need exact likelihoods, and any order "
                     "gives only a bound (trainer/evaluate.py scores it): give l2r"),
    ("order=uniform", "order='uniform': lm-eval's tasks need exact likelihoods"),
    ("weights=best", "weights must be 'ema' or 'raw'"),
    ("batch_size=0", "batch_size=0: give a positive integer"),
    ("temperature=1", "--model_args temperature: unknown to aogpt"),
    ("draft=-1", "draft=-1: give the tokens drafted ahead per call, an integer >= 0"),
])
def test_bad_model_args_are_one_line_errors(ckpt, model_args, message):
    with pytest.raises(UsageError) as err:
        AOGPTLM.create_from_arg_string(f"ckpt={ckpt},{model_args}", {"device": "cpu"})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_missing_checkpoint_is_a_one_line_error(tmp_path):
    with pytest.raises(UsageError, match="ckpt=PATH is required"):
        AOGPTLM.create_from_arg_string("order=l2r")
    with pytest.raises(UsageError) as err:
        AOGPTLM.create_from_arg_string(f"ckpt={tmp_path / 'missing'}")
    assert str(err.value).startswith(f"no checkpoint at {tmp_path / 'missing'}")
    assert "\n" not in str(err.value)


def test_generation_under_the_ensemble_is_a_one_line_error(ckpt):
    from lm_eval.api.instance import Instance

    lm = AOGPTLM(ckpt=str(ckpt), order="ensemble:2", device="cpu")
    request = Instance("generate_until", {}, ("The dog", {"until": ["\n"]}), 0)
    with pytest.raises(UsageError, match="order=ensemble:M scores likelihoods only") as err:
        lm.generate_until([request])
    assert "\n" not in str(err.value)


def test_only_the_harness_module_imports_lm_eval():
    """aogpt without lm-eval installed: every other module of the project imports without it."""
    importers = []
    sources = ("aogpt", "model", "trainer", "data_prep", "tools", "benchmarks", "experiments")
    for path in (path for folder in sources for path in (REPO / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name.split(".")[0] == "lm_eval" for name in names):
                importers.append(str(path.relative_to(REPO)))
    assert sorted(set(importers)) == ["trainer/lm_harness.py"]


# ---- what lm-eval's command line returned ---------------------------------------------------

def test_loglikelihood_is_the_left_to_right_log_probability_of_the_continuation(
        cli_samples, model64, encoding):
    samples, results = cli_samples
    log_ps = []
    for sample, text in zip(samples["tiny_lambada"], PASSAGES, strict=True):
        context, target = text.rsplit(" ", 1)
        whole, scored = continuation_split(encoding, context, " " + target)
        row = whole[-BLOCK:]  # the first passage's context is cut on the left
        with torch.no_grad():
            logits = model64.logits(torch.tensor([row]))[0, -scored:, :GPT2_VOCAB]
        expected = -nll64(model64, row)[-scored:].sum().item()
        greedy = logits.argmax(-1).tolist() == row[-scored:]
        log_p, is_greedy = sample["resps"][0][0]
        assert float(log_p) == pytest.approx(expected, rel=0, abs=scored * PER_TOKEN)
        assert str(is_greedy) == str(greedy)
        log_ps.append(float(log_p))
    assert len(encoding.encode_ordinary(PASSAGES[0])) > BLOCK
    assert results["tiny_lambada"]["perplexity,none"] == pytest.approx(
        math.exp(-sum(log_ps) / len(log_ps)), rel=1e-12)


def test_loglikelihood_rolling_scores_every_token_once_in_rolling_windows(
        cli_samples, model64, encoding):
    samples, results = cli_samples
    total, words = 0.0, 0
    for sample, text in zip(samples["tiny_rolling"], DOCUMENTS, strict=True):
        tokens = encoding.encode_ordinary(text)
        log_p = float(sample["resps"][0][0])
        assert log_p == pytest.approx(rolling_reference(model64, tokens), rel=0,
                                      abs=len(tokens) * PER_TOKEN)
        total, words = total + log_p, words + len(re.split(r"\s+", text))
    assert len(encoding.encode_ordinary(DOCUMENTS[0])) > 2 * BLOCK  # three windows at least
    assert results["tiny_rolling"]["word_perplexity,none"] == pytest.approx(
        math.exp(-total / words), rel=1e-12)


def test_generate_until_is_greedy_and_stops_at_until_or_max_gen_toks(cli_samples, model64,
                                                                     encoding):
    samples, _ = cli_samples
    stop = samples["tiny_generate"][0]["arguments"]["gen_args_0"]["arg_1"]["until"][1]
    answers = [sample["resps"][0][0] for sample in samples["tiny_generate"]]
    expected = [encoding.decode(greedy_tokens(model64, encoding.encode_ordinary(p), NEW_TOKENS))
                for p in PROMPTS]
    assert stop in expected[0] and answers[0] == expected[0].split(stop)[0]
    assert answers[1] == expected[1]  # all max_gen_toks tokens


# ---- lm-eval's own `hf` model on the exported folder --------------------------------------------
# lm-eval's HFLM (0.4.13) reads max_length = BLOCK - 1 from the folder's max_position_embeddings
# (BLOCK - 1 input tokens take BLOCK slots, [None] first). What it then feeds the model:
#   loglikelihood, non-empty context: (context + continuation)[-BLOCK:] less its last token,
#     right-padded, no BOS: the BLOCK slots that aogpt runs for (context + continuation)[-BLOCK:],
#     so the same numbers;
#   loglikelihood_rolling: windows of BLOCK - 1 scored tokens, as aogpt's (rolling_rows takes
#     HFLM's), but the first window's context is the tokenizer's BOS, <|endoftext|> (EOS), where
#     aogpt has the [None] slot alone: HF scores a text's first BLOCK - 1 tokens as if it followed
#     an end of text (as in the training stream), at positions 1.., aogpt at 0.. . Every later
#     window is the same;
#   loglikelihood with an empty context (none here): EOS as the context too;
#   generate_until: the folder's greedy generate(), left to right like aogpt's sampler.


@pytest.fixture(scope="module")
def hf_samples(tasks, ckpt, tmp_path_factory):
    """The three tasks with lm-eval's built-in `hf` model, through lm-eval's own evaluator in this
    process, beside the aogpt command line (cli_run, already started). The command line is tested
    once, by cli_run: a second one would index lm-eval's thousands of built-in tasks again (~20 s
    of CPU) for three local ones. The command line's offline environment is set for the evaluation
    (libraries imported before, as transformers by export_hf, keep what they read at import). Its
    samples and results are saved by lm-eval's EvaluationTracker as the command line saves them
    (resps as strings), then read back as cli_run's are: both sides compare in the same form."""
    pytest.importorskip("accelerate")  # lm-eval's hf model imports it
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    out = tmp_path_factory.mktemp("lm_harness_hf")
    tool("export_hf").export(ckpt, out / "hf_model")  # EMA weights, as the aogpt run reads
    tracker = EvaluationTracker(output_path=str(out / "results"))
    with pytest.MonkeyPatch.context() as patch:  # for this evaluation only
        for name, value in offline(out).items():
            patch.setenv(name, value)
        run = lm_eval.simple_evaluate(
            model="hf", model_args=f"pretrained={out / 'hf_model'},trust_remote_code=True,"
                                   "dtype=float32",
            tasks=list(TASKS), device="cpu", batch_size=2, log_samples=True,
            evaluation_tracker=tracker,
            task_manager=TaskManager(include_path=str(tasks), include_defaults=False))
    samples = run.pop("samples")  # what lm-eval's command line does with the run (_cli/run.py)
    tracker.save_results_aggregated(results=run, samples=samples)
    for name in run["configs"]:
        tracker.save_results_samples(task_name=name, samples=samples[name])
    return written_run(out / "results")


def test_hf_model_loglikelihood_equals_aogpts(hf_samples, cli_samples, model64, encoding):
    """Each side is within PER_TOKEN per token of float64 (HF's forward runs the same fp32 ops,
    its head on the slots after [None] only, then lm-eval's fp32 log_softmax: measured 1.7e-6 at
    most over 564 tokens). HF sums a continuation's log-probs in fp32, which rounds by at most
    (scored - 1) x 2^-24 x |sum| (any summation order): that is added on its side."""
    (hf, hf_results), (aogpt, aogpt_results) = hf_samples, cli_samples
    apart = []  # how far each pair of answers may be
    for ours, theirs, text in zip(aogpt["tiny_lambada"], hf["tiny_lambada"], PASSAGES, strict=True):
        context, target = text.rsplit(" ", 1)
        whole, scored = continuation_split(encoding, context, " " + target)
        expected = -nll64(model64, whole[-BLOCK:])[-scored:].sum().item()
        log_p, is_greedy = theirs["resps"][0][0]
        tolerance = scored * PER_TOKEN + (scored - 1) * 2**-24 * abs(expected)
        assert float(log_p) == pytest.approx(expected, rel=0, abs=tolerance)
        apart.append(tolerance + scored * PER_TOKEN)
        assert float(log_p) == pytest.approx(float(ours["resps"][0][0][0]), rel=0, abs=apart[-1])
        assert is_greedy == ours["resps"][0][0][1]  # (HF's argmax also sees the padded ids)
    assert hf_results["tiny_lambada"]["acc,none"] == aogpt_results["tiny_lambada"]["acc,none"]
    assert hf_results["tiny_lambada"]["perplexity,none"] == pytest.approx(
        aogpt_results["tiny_lambada"]["perplexity,none"], rel=math.expm1(max(apart)))


def test_hf_model_rolling_reads_the_text_after_an_end_of_text(hf_samples, cli_samples, model64,
                                                              encoding):
    """HF's log p(text) is the rolling reference with EOS before the first window, and differs
    from aogpt's by the first window's terms only. Tolerance: PER_TOKEN per token on each side,
    plus HF's fp32 sum of each window's log-probs, (47 - 1) x 2^-24 x |window sum| at most."""
    (hf, _), (aogpt, _) = hf_samples, cli_samples
    for ours, theirs, text in zip(aogpt["tiny_rolling"], hf["tiny_rolling"], DOCUMENTS,
                                  strict=True):
        tokens = encoding.encode_ordinary(text)
        log_p, aogpt_log_p = float(theirs["resps"][0][0]), float(ours["resps"][0][0])
        expected = rolling_reference(model64, tokens, prefix=(EOS,))
        tolerance = len(tokens) * PER_TOKEN + (BLOCK - 2) * 2**-24 * abs(expected)
        assert log_p == pytest.approx(expected, rel=0, abs=tolerance)
        after_eos = first_window(model64, tokens, (EOS,)) - first_window(model64, tokens)
        assert log_p - aogpt_log_p == pytest.approx(after_eos, rel=0,
                                                    abs=tolerance + len(tokens) * PER_TOKEN)


def test_hf_model_greedy_generation_equals_aogpts(hf_samples, cli_samples):
    """generate() by full forwards and aogpt's KV-cache sampler choose the same tokens, cut at the
    same stop word or max_gen_toks."""
    (hf, _), (aogpt, _) = hf_samples, cli_samples
    assert [s["resps"] for s in hf["tiny_generate"]] == [s["resps"] for s in aogpt["tiny_generate"]]


# ---- offline: a task whose dataset is not here is one line before any model loads ----------

@pytest.fixture
def offline_process(monkeypatch, tmp_path):
    """This process offline, as HF_HUB_OFFLINE=1 makes it, with an empty Hugging Face cache; put
    back after the test (the check sets offline mode for the rest of a real run)."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for module, name in ((huggingface_hub.constants, "HF_HUB_OFFLINE"),
                         (datasets.config, "HF_HUB_OFFLINE"),
                         (datasets.config, "HF_DATASETS_OFFLINE")):
        monkeypatch.setattr(module, name, True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")


def test_offline_a_task_whose_dataset_is_not_cached_is_one_line(tasks, tmp_path,
                                                                 offline_process):
    from lm_eval.tasks import TaskManager

    from aogpt.trainer.lm_harness import check_offline

    (tmp_path / "hub_lambada.yaml").write_text(
        "task: hub_lambada\ndataset_path: EleutherAI/lambada_openai\ndataset_name: default\n"
        "test_split: test\noutput_type: loglikelihood\ndoc_to_text: \"{{text}}\"\n"
        "doc_to_target: \" x\"\n")
    manager = TaskManager(include_path=[str(tasks), str(tmp_path)], include_defaults=False)
    check_offline(manager, list(TASKS))  # local files: available
    with pytest.raises(UsageError) as refused:
        check_offline(manager, ["tiny_lambada", "hub_lambada"])
    assert str(refused.value).startswith(
        "lm-eval task hub_lambada: its dataset EleutherAI/lambada_openai (default) is not "
        f"available offline (not in the Hugging Face cache {tmp_path / 'hf' / 'datasets'}, and "
        "the hub cannot be reached): run `python -c \"import datasets; datasets.load_dataset("
        "'EleutherAI/lambada_openai', 'default')\"` where the hub can be reached")


@pytest.mark.slow  # lm-eval reads its ~15,000 task files first (~20 s)
def test_offline_lm_eval_on_a_task_not_cached_ends_in_one_line_before_the_model(tmp_path):
    """The checkpoint does not even exist: the task is refused before any model is loaded."""
    result = subprocess.run(
        [sys.executable, "-m", "aogpt.trainer.lm_harness", "--model", "aogpt", "--model_args",
         f"ckpt={tmp_path / 'no-checkpoint'}", "--tasks", "lambada_openai", "--device", "cpu"],
        capture_output=True, text=True, cwd=REPO, timeout=600,
        env={**os.environ, **offline(tmp_path)})
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: lm-eval task lambada_openai: its dataset EleutherAI/lambada_openai (default) is "
        "not available offline"), result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == errors[0]
    assert not (tmp_path / "no-checkpoint").exists()
