"""The model "aogpt" for EleutherAI's lm-evaluation-harness (0.4.x): benchmarks on a checkpoint.

    python -m aogpt.trainer.lm_harness --model aogpt --model_args ckpt=PATH[,order=l2r|ensemble:M]
        [,weights=ema|raw][,device=auto|cpu|cuda:N][,batch_size=B][,precision=fp32|bf16][,seed=S]
        [,draft=K]
        --tasks lambada_openai,wikitext [any other flag of `lm-eval run`]

lm-eval 0.4.13 resolves --model in its own registry only, which its own modules fill when imported;
it does not look for models in other installed packages, so a plain `lm-eval --model aogpt` cannot
find this one. This module registers "aogpt" and then runs lm-eval's own command line with the
arguments it was given (`run` is implied, as with `lm-eval`). From Python: import this module,
then lm_eval.simple_evaluate(model="aogpt", model_args="ckpt=PATH", tasks=[...]).

ckpt: an out_dir, a checkpoint folder or a model.safetensors (as trainer/evaluate.py's --ckpt).
weights: ema (default, as the paper evaluates) or raw. batch_size: sequences per forward; model_args
win over lm-eval's own --batch_size and --device. precision: fp32 (default, TF32 off) or bf16
(autocast for scoring, bf16 weights for sampling). seed: the ensemble's members and
generate_until's sampling. draft: generate_until with the speculative sampler, K tokens drafted
ahead per call (an any-order model's): the same distribution as one token per call, the same
tokens when greedy, in fewer calls (default 0: one token per call).

The request types, read left to right (orders of the identity: exact likelihoods, no bound):
  loglikelihood          log p(continuation | context) summed over the continuation's tokens, and
                         is_greedy: each of them is the argmax of its distribution (GPT-2's 50257
                         ids; the padded ones are never generated). The context is cut on the left
                         to fit block_size.
  loglikelihood_rolling  log p(text), in lm-eval's rolling windows (lm_eval.utils, as its HFLM):
                         every token is scored once, each window after the first keeps the token
                         before it as context.
  generate_until         the KV-cache sampler (model/sampler/) left to right, one token per
                         step (exact ancestral sampling), greedy unless the task sets do_sample or
                         a temperature; max_gen_toks tokens, cut at the first `until` string or
                         <|endoftext|>. The context is cut on the left to leave them room.
Every sequence starts at the model's [None] slot, as in training and in trainer/evaluation.py: no
BOS/EOS token is prepended, and an empty context is the [None] slot alone.

order=ensemble:M is the paper's context-order ensemble (Finding 5, trainer/ensemble.py) applied
to each scored token x_i: p_ens(x_i) = the mean over M members of p(x_i | x_<i read in a permuted
order), member 0 left to right; is_greedy then asks for the argmax of p_ens. Members are keyed by
(seed, x_<i, i, member), so a score depends neither on the batch nor on the other requests. The
sampler has no ensemble: generate_until under it is an error.

Offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set, or the hub out of reach), the command line
checks that every task's dataset is in the Hugging Face cache (or local files) before lm-eval
loads a model or a dataset: one line names the first task that is not, and how to make it
available, instead of lm-eval's ConnectionError traceback once the model has loaded. A hub out of
reach is then read as offline for the whole run (no retries of the hub per file).

lm-eval is imported by this module only: the rest of aogpt runs without it installed.
"""

from __future__ import annotations

import copy
import hashlib
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string

from aogpt import UsageError, cli_entry
from aogpt.data_prep.tokenizer import EOS, load_gpt2
from aogpt.model import AOGPT, load_checkpoint
from aogpt.model.config import GPT2_VOCAB
from aogpt.model.orders import ANY_ORDER, LEFT_TO_RIGHT, READINGS, per_reading, reading_named
from aogpt.model.precision import resolve_device
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, given_tokens
from aogpt.progress import progress
from aogpt.trainer.ensemble import ensemble_member_nll, mixture_nll
from aogpt.trainer.evaluation import PRECISIONS, precision_policy

NAME = "aogpt"
# Registered by path rather than by decorating the class: `python -m aogpt.trainer.lm_harness`
# runs this file as __main__ and lm-eval then imports it under its own name; a class object would
# be registered twice (an error), the same path is registered once.
model_registry.register(NAME, target="aogpt.trainer.lm_harness:AOGPTLM")
GENERATION_OPTIONS = {"until", "max_gen_toks", "do_sample", "temperature", "top_p", "top_k"}
_ROLLING_START = -1  # the prefix lm-eval's rolling windows put first: the [None] slot here


# What lm-eval does with each reading (model/orders.py per_reading: a new reading needs its entry
# here): None, scored along the network's causal path; or why it is refused. lm-eval's tasks
# compare exact log-likelihoods of a continuation after its context, which only a reading of the
# context first, then the continuation left to right, gives
LM_EVAL_READINGS = per_reading("trainer/lm_harness.py LM_EVAL_READINGS", {
    LEFT_TO_RIGHT.word: None,
    # a bound is no likelihood: lm-eval would compare bounds
    ANY_ORDER.word: f"{ANY_ORDER.label} gives only a bound (trainer/evaluate.py scores it)",
})


def parse_order(spec: str) -> int:
    """"l2r" (or an alias) -> 1, "ensemble:M" -> M: the members each scored token is averaged
    over."""
    kind, _, members = str(spec).partition(":")
    if kind == "ensemble" and members.isdigit() and int(members) >= 1:
        return int(members)
    scored = " or ".join(reading.spelled() for reading in READINGS
                         if LM_EVAL_READINGS[reading.word] is None)
    choices = f"give {scored} or ensemble:M (M >= 1 members, e.g. ensemble:8)"
    try:
        reading = reading_named(spec, "order")
    except UsageError:
        raise UsageError(f"order={spec!r}: {choices}") from None
    refusal = LM_EVAL_READINGS[reading.word]
    if refusal is not None:
        raise UsageError(f"order={spec!r}: lm-eval's tasks need exact likelihoods, and "
                         f"{refusal}: {choices}")
    return 1


def context_key(context: list[int]) -> int:
    """A 62-bit key of the tokens before a scored token: its ensemble members' permutations are
    drawn from it. Not from the token itself, nor from what follows: then p_ens(. | context) is
    one distribution, the same whichever token is scored, and sums to one."""
    digest = hashlib.blake2b(np.asarray(context, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def rolling_rows(tokens: list[int], block_size: int) -> Iterator[tuple[list[int], int]]:
    """lm-eval's rolling windows as rows: (the row's tokens, how many at its end are scored).

    [None] takes one of the block_size slots, so a window holds block_size - 1 input tokens; the
    first window's prefix is the [None] slot itself."""
    windows = get_rolling_token_windows(tokens, prefix_token=_ROLLING_START,
                                        max_seq_len=block_size - 1, context_len=1)
    for context, continuation in map(make_disjoint_window, windows):
        row = [t for t in context if t != _ROLLING_START] + continuation
        yield row, len(continuation)


class AOGPTLM(TemplateLM):
    """An aogpt checkpoint as an lm-eval LM (see the module's docstring for what it computes)."""

    def __init__(self, ckpt: str | None = None, order: str = LEFT_TO_RIGHT.word,
                 weights: str = "ema", device: str | None = None, batch_size: int | str = 8,
                 precision: str = "fp32", seed: int = 0, tokenizer_file: str | None = None,
                 max_batch_size: int | None = None, draft: int = 0, **unknown):
        super().__init__()
        if unknown:
            raise UsageError(f"--model_args {', '.join(sorted(unknown))}: unknown to aogpt; it "
                             "takes ckpt, order, weights, device, batch_size, precision, seed, "
                             "tokenizer_file, draft")
        if ckpt is None:
            raise UsageError("--model_args ckpt=PATH is required: an out_dir, a checkpoint "
                             "folder or a model.safetensors")
        self.members = parse_order(order)
        if precision not in PRECISIONS:
            raise UsageError(f"precision={precision!r}: use one of {', '.join(PRECISIONS)}")
        self.batch_size = _parse_batch_size(batch_size)
        if not isinstance(seed, int):
            raise UsageError(f"seed={seed!r}: give an integer")
        self.seed = seed
        if not isinstance(draft, int) or draft < 0:
            raise UsageError(f"draft={draft!r}: give the tokens drafted ahead per call, an integer "
                             ">= 0 (0: one token per call)")
        self.draft = draft
        self._device = resolve_device(str(device or "auto"), setting="device=")
        self.model = load_checkpoint(str(ckpt), weights=weights, map_location=self._device)
        self.model.config.require_gpt2("lm-eval")
        if draft:
            self.model.config.require_any_order("draft=K drafts positions ahead of the next "
                                                "one; use draft=0")
        if self.members > 1:
            self.model.config.require_any_order(f"order={order} reads permuted contexts; use "
                                                f"order={LEFT_TO_RIGHT.word}")
        self.precision = precision
        self._bf16_model: AOGPT | None = None
        self.encoding = load_gpt2(tokenizer_file)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        # lm-eval always passes its own --batch_size (default 1) and --device: model_args win, as a
        # key given twice would otherwise be a TypeError
        config = {k: v for k, v in (additional_config or {}).items() if v is not None}
        harness_device = str(config.get("device", ""))
        if harness_device.startswith("cuda") and not torch.cuda.is_available():
            # lm-eval's default is cuda:0, given or not; like its HFLM, fall back to the CPU
            # (device=cuda in model_args is taken at its word)
            print(f"aogpt: --device {harness_device} but no CUDA GPU here: running on the CPU",
                  file=sys.stderr)
            config["device"] = "cpu"
        return cls(**{**config, **arg_dict})

    # ---- what TemplateLM asks for -------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return EOS

    @property
    def max_length(self) -> int:
        return self.model.config.block_size

    @property
    def tokenizer_name(self) -> str:
        return "gpt2"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   **kwargs) -> list[int]:
        return self.encoding.encode_ordinary(string)  # as data_prep: text, never special tokens

    def tok_decode(self, tokens: list[int]) -> str:
        return self.encoding.decode(tokens)

    # ---- likelihoods ----------------------------------------------------------------------------

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False
                      ) -> list[tuple[float, bool]]:
        pairs = []
        for context, continuation in (request.args for request in requests):
            if context:
                context_enc, continuation_enc = self._encode_pair(context, continuation)
            else:  # the [None] slot is the whole context (TemplateLM would put EOS there)
                context_enc, continuation_enc = [], self.tok_encode(continuation)
            pairs.append(((context, continuation), context_enc, continuation_enc))
        return self._loglikelihood_tokens(pairs, disable_tqdm=disable_tqdm)

    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str], list[int], list[int]]],
                              disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        rows = []
        for _, context_enc, continuation_enc in requests:
            if len(continuation_enc) > self.max_length:
                raise UsageError(f"a continuation of {len(continuation_enc)} tokens is longer "
                                 f"than the model's block_size {self.max_length}")
            rows.append(((context_enc + continuation_enc)[-self.max_length:],
                         len(continuation_enc)))
        results = self.score_rows(rows, greedy=True, disable_tqdm=disable_tqdm)
        for (pair, _, _), result in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", pair, result)
        return results

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False
                              ) -> list[float]:
        rows, owners = [], []
        for number, (text,) in enumerate(request.args for request in requests):
            for row in rolling_rows(self.tok_encode(text), self.max_length):
                rows.append(row)
                owners.append(number)
        totals = [0.0] * len(requests)
        for owner, (log_p, _) in zip(owners, self.score_rows(rows, False, disable_tqdm),
                                     strict=True):
            totals[owner] += log_p
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    @torch.inference_mode()
    def score_rows(self, rows: list[tuple[list[int], int]], greedy: bool,
                   disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(log p of the last `scored` tokens of each row given the ones before it, whether each
        of them is the argmax) per (row tokens, scored) pair. Rows run longest first, right-padded
        in batches: causal attention keeps the padding out of every real slot."""
        results: list[tuple[float, bool]] = [(0.0, True)] * len(rows)
        by_length = sorted(range(len(rows)), key=lambda r: -len(rows[r][0]))
        batches = [by_length[i:i + self.batch_size] for i in range(0, len(rows), self.batch_size)]
        with precision_policy(self.precision, self._device):
            for batch in progress(batches, desc="aogpt scoring", unit="batch",
                                  disable=disable_tqdm):
                scored = [rows[r] for r in batch if rows[r][1] > 0]
                if scored:
                    done = iter(self.score_batch(scored, greedy))
                    for r in batch:
                        if rows[r][1] > 0:
                            results[r] = next(done)
        return results

    def score_batch(self, rows: list[tuple[list[int], int]], greedy: bool
                    ) -> list[tuple[float, bool]]:
        model, device = self.model, self._device
        idx = torch.zeros(len(rows), max(len(tokens) for tokens, _ in rows), dtype=torch.long)
        for r, (tokens, _) in enumerate(rows):
            idx[r, :len(tokens)] = torch.tensor(tokens)
        idx = idx.to(device)
        nll, hidden = model.nll_and_hidden(idx)  # (b, t), (b, t, d): is_greedy reads the states
        # the scored units: (row, position) of the last `scored` tokens of every row
        units = [(r, i) for r, (row, scored) in enumerate(rows)
                 for i in range(len(row) - scored, len(row))]
        unit_row, unit_target = torch.tensor(units, device=device).T
        unit_nll = nll[unit_row, unit_target].double()[:, None]  # (U, 1): member 0
        # the probabilities of each unit's members summed (their mean up to M): its argmax is
        # the greedy token of the mixture
        probs = self.real_probs(hidden[unit_row, unit_target]) if greedy else None
        if self.members > 1:
            keys = torch.tensor([context_key(rows[r][0][:i]) for r, i in units], device=device)
            base = torch.arange(idx.shape[1], device=device).expand(len(idx), -1)  # left to right

            def add_member_probs(units: torch.Tensor, member_hidden: torch.Tensor) -> None:
                probs.index_add_(0, units, self.real_probs(member_hidden))

            members, _, _ = ensemble_member_nll(
                model, idx, base, keys, unit_row, unit_target, self.members, self.seed,
                self.batch_size * self.max_length, add_member_probs if greedy else None)
            unit_nll = mixture_nll(torch.cat([unit_nll, members], dim=1))
        else:
            unit_nll = unit_nll[:, 0]
        sums = torch.zeros(len(rows), dtype=torch.float64, device=device)
        sums.index_add_(0, unit_row, unit_nll)
        hits = torch.ones(len(rows), dtype=torch.bool, device=device)
        if greedy:
            missed = probs.argmax(dim=-1) != idx[unit_row, unit_target]
            hits[unit_row[missed]] = False
        return list(zip((-sums).tolist(), hits.tolist(), strict=True))

    def real_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """(U, d) final hidden states -> (U, 50257) fp32: the probabilities of GPT-2's real ids
        (normalized over the whole padded vocabulary, as the NLL is; the padded ids are never
        generated, so they cannot be the greedy choice)."""
        return self.model.lm_head(hidden).float().softmax(dim=-1)[:, :GPT2_VOCAB]

    # ---- generation -----------------------------------------------------------------------------

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        if self.members > 1:
            raise UsageError("generate_until: order=ensemble:M scores likelihoods only, the "
                             "sampler has no ensemble; run generation tasks with "
                             f"order={LEFT_TO_RIGHT.word}")
        jobs = [self.generation_job(number, context, gen_kwargs)
                for number, (context, gen_kwargs) in enumerate(r.args for r in requests)]
        # one sampler per batch of requests that share their sampling settings
        groups: dict[tuple, list[dict]] = {}
        for job in jobs:
            groups.setdefault(job["settings"], []).append(job)
        batches = [group[i:i + self.batch_size] for group in groups.values()
                   for i in range(0, len(group), self.batch_size)]
        texts = [""] * len(requests)
        with torch.inference_mode():
            for batch in progress(batches, desc="aogpt generating", unit="batch",
                                  disable=disable_tqdm):
                for job, text in zip(batch, self.generate_batch(batch), strict=True):
                    texts[job["number"]] = text
        for request, text in zip(requests, texts, strict=True):
            self.cache_hook.add_partial("generate_until", request.args, text)
        return texts

    def sampling_model(self) -> AOGPT:
        """The model the sampler runs: its KV cache holds the weights' dtype, so bf16 is a bf16
        copy of the weights (as trainer/sample.py runs on a GPU) rather than autocast."""
        if self.precision == "fp32":
            return self.model
        if self._bf16_model is None:
            self._bf16_model = copy.deepcopy(self.model).to(torch.bfloat16)
        return self._bf16_model

    def generation_job(self, number: int, context: str, gen_kwargs: dict) -> dict:
        kwargs = normalize_gen_kwargs(gen_kwargs, default_max_gen_toks=256)
        unknown = sorted(set(kwargs) - GENERATION_OPTIONS)
        if unknown:
            raise UsageError(f"generate_until: the aogpt sampler has no option "
                             f"{', '.join(unknown)} "
                             f"(it takes {', '.join(sorted(GENERATION_OPTIONS))})")
        new_tokens = kwargs["max_gen_toks"]
        if not 1 <= new_tokens < self.max_length:
            raise UsageError(f"generate_until: max_gen_toks={new_tokens} must be in 1.."
                             f"{self.max_length - 1} (the model's block_size less one token of "
                             f"context)")
        context_enc = self.tok_encode(context)[-(self.max_length - new_tokens):] if context else []
        temperature = float(kwargs["temperature"]) if kwargs["do_sample"] else 0.0
        settings = (new_tokens, temperature, float(kwargs.get("top_p", 1.0)),
                    int(kwargs.get("top_k", 0)))
        return {"number": number, "context": context_enc, "settings": settings,
                "until": handle_stop_sequences(kwargs["until"], eos=self.tok_decode([EOS]))}

    def generate_batch(self, jobs: list[dict]) -> list[str]:
        """Left-to-right generation of a batch whose contexts may differ in length: each sample
        reveals one token per step after its own context, so the shorter ones run longer; only
        their first max_gen_toks tokens are kept."""
        new_tokens, temperature, top_p, top_k = jobs[0]["settings"]
        given = [len(job["context"]) for job in jobs]
        seq_len = max(given) + new_tokens
        rows = [given_tokens(seq_len, prompt=job["context"]) for job in jobs]
        tokens, mask = (torch.stack(parts) for parts in zip(*rows, strict=True))
        config = SamplingConfig(sampler="speculative" if self.draft else "parallel",
                                steps=seq_len - min(given), draft=max(self.draft, 1),
                                order=LEFT_TO_RIGHT.word, temperature=temperature, top_p=top_p,
                                top_k=top_k, seed=self.seed)
        sampler = KVCacheSampler(self.sampling_model(), len(jobs), seq_len, config,
                                 cuda_graphs=False)
        out = sampler.generate(torch.tensor([job["number"] for job in jobs]), tokens, mask)
        texts = []
        for row, job in enumerate(jobs):
            text = self.tok_decode(out.tokens[row, given[row]:given[row] + new_tokens].tolist())
            for stop in job["until"]:
                if stop:
                    text = text.split(stop)[0]
            texts.append(text)
        return texts


def _parse_batch_size(value: int | str) -> int:
    """An integer >= 1; lm-eval's "auto" (no search for the largest batch here) means 8."""
    if isinstance(value, str) and value.startswith("auto"):
        return 8
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = 0
    if size < 1:
        raise UsageError(f"batch_size={value!r}: give a positive integer")
    return size


# ---- offline: every task's dataset where lm-eval will look for it ----------------------------

HUB_PROBE_S = 5  # the hub answers a request within this, or the run is offline


def hub_reachable() -> bool:
    """Whether the Hugging Face hub answers at all (any HTTP status): not, when offline is set."""
    import datasets.config
    import huggingface_hub.constants

    if datasets.config.HF_HUB_OFFLINE:  # HF_HUB_OFFLINE or HF_DATASETS_OFFLINE
        return False
    try:
        urllib.request.urlopen(huggingface_hub.constants.ENDPOINT, timeout=HUB_PROBE_S).close()
    except urllib.error.HTTPError:
        return True  # it answered
    except (urllib.error.URLError, OSError):
        return False
    return True


def read_offline() -> None:
    """Makes the hub libraries read their caches only, for the rest of this process (as
    HF_HUB_OFFLINE=1 would have from its start)."""
    import datasets.config
    import huggingface_hub.constants

    os.environ["HF_HUB_OFFLINE"] = "1"  # for any process started from here
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True


def task_datasets(manager, names: list) -> Iterator[tuple[str, dict]]:
    """(task, its config) of each task that `names` selects (tasks, groups, tags, YAML paths)
    and that names a dataset (dataset_path): the configs lm-eval's task index holds, read
    without building the tasks (which would load their datasets)."""
    from lm_eval.tasks._index import Kind, TaskIndex

    seen = set()
    pending = [name for name in names if isinstance(name, str)]
    while pending:
        name = pending.pop(0)
        if name in seen:
            continue
        seen.add(name)
        entry = manager.task_index.get(name) or TaskIndex.entry_from_path(Path(name))
        if entry is None:
            continue  # not a task lm-eval knows: it says so itself
        if entry.kind is Kind.TAG:
            pending += sorted(entry.tags)
            continue
        config = manager._factory._load_full_config(entry)
        if entry.kind is Kind.GROUP:
            pending += [member if isinstance(member, str) else member.get("task")
                        for member in config.get("task") or [] if member]
        elif config.get("dataset_path"):
            yield config.get("task", name), config


def check_offline(manager, names: list) -> None:
    """Refuses, naming the first task whose dataset is neither in the Hugging Face cache nor in
    local files, a run whose hub is out of reach; says nothing when the hub can be reached."""
    import datasets

    if hub_reachable():
        return
    read_offline()
    for task, config in task_datasets(manager, names):
        path, name = config["dataset_path"], config.get("dataset_name")
        kwargs = {key: value for key, value in (config.get("dataset_kwargs") or {}).items()
                  if key != "trust_remote_code"}  # as lm-eval passes them (datasets >= 4)
        try:
            datasets.load_dataset_builder(path, name, **kwargs)
        except (ConnectionError, FileNotFoundError):
            load = f"datasets.load_dataset({path!r}{f', {name!r}' if name else ''})"
            raise UsageError(
                f"lm-eval task {task}: its dataset {path}{f' ({name})' if name else ''} is not "
                f"available offline (not in the Hugging Face cache "
                f"{datasets.config.HF_DATASETS_CACHE}, and the hub cannot be reached): run "
                f"`python -c \"import datasets; {load}\"` where the hub can be reached, with the "
                f"same HF_HOME (or copy that cache here), or give a task of local files "
                f"(--include_path)") from None
        except Exception:  # not a dataset out of reach: lm-eval's to report, as it would have
            continue


def _checked_task_selection() -> None:
    """lm-eval's command line selects its tasks (EvaluatorConfig.process_tasks, an index of task
    files) before it loads a model or a dataset: check_offline runs right after, on its index."""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    select = EvaluatorConfig.process_tasks

    def process_tasks(self, metadata: dict | None = None):
        manager = select(self, metadata)
        check_offline(manager, self.tasks if isinstance(self.tasks, list) else [self.tasks])
        return manager

    EvaluatorConfig.process_tasks = process_tasks


@cli_entry
def main(argv: list[str] | None = None) -> int:
    """lm-eval's own command line, with "aogpt" registered (this module's import did that) and
    the tasks' datasets checked when offline."""
    from lm_eval.__main__ import cli_evaluate

    _checked_task_selection()
    sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]  # lm-eval parses sys.argv
    cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
