"""The GPU's fast paths, checked on the CPU: the compiled decode step (torch.compile with
inductor, which writes C++ kernels here from the same graphs it gives Triton on a GPU) computes
what the eager step computes and compiles once per step shape; CUDA-graph replays (emulated:
captured once, replayed after) give the eager tokens; a failing compiler costs a warning, never
a generation."""

import functools
import json
import os

import pytest
import torch
from conftest import perturbed_float64_model, run_cli
from torch._dynamo.utils import counters

from aogpt.model import AOGPT, save_consolidated
from aogpt.model.config import ModelConfig
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, filter_logits, sample_from_logits

B, N = 3, 16

# fp32's unit roundoff is u = 2^-24 ~ 6e-8. Both steps run the same library matmuls and
# attention; inductor changes only the order of the other reductions it fuses (RMSNorm's mean
# over d = 32, the softmax over 50K logits, the sampler's sums), each off by at most
# length x u relative: ~2e-6 for d = 32, ~3e-3 for 50K terms but only on the softmax, which
# does not feed the logits. Two layers of norms and residual adds keep the logits within
# ~1e-5 of their scale; the bound below is 10x that. A missed term (a wrong mask, a stale
# table, a row read from the wrong slot) moves them by O(1).
LOGIT_BOUND = 1e-4


def peaked_model():
    """fp32, with its head scaled so that its next-token distributions are peaked (as a trained
    model's are: an untrained one spreads ~2e-5 over each of 50K tokens, so that every draw is
    within any rounding of a tie)."""
    config = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=N, cond_dim=8)
    model = perturbed_float64_model(config, seed=1).float()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    return model


def sampler_mid_generation(model, compiled: bool, known: int, targets: int) -> KVCacheSampler:
    """Both samplers in the same state: `known` tokens revealed, `targets` drawn next."""
    sampler = KVCacheSampler(model, B, N, SamplingConfig(steps=N, seed=0), compile=compiled)
    generator = torch.Generator().manual_seed(known)
    sampler.orders.copy_(torch.stack([torch.randperm(N, generator=generator) for _ in range(B)]))
    sampler.ordered[:, :N].copy_(torch.randint(0, 50257, (B, N), generator=generator))
    sampler.uniforms.copy_(torch.rand(B, N, generator=generator, dtype=torch.float64))
    sampler.strategy.bounds.copy_(torch.tensor([[known], [known], [known + targets]]).expand(3, B))
    return sampler


def decision_margin(logits: torch.Tensor, drawn: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """How far (in probability) the inverse-CDF point u x total lies from the nearest edge of the
    drawn token's interval: a perturbation of the logits by e moves every edge by at most
    ~2e (relative), so a margin above that decides the same token."""
    probs = filter_logits(logits, SamplingConfig()).double().softmax(dim=-1)
    cdf = probs.cumsum(dim=-1)
    upper = cdf.gather(-1, drawn[..., None]).squeeze(-1)
    lower = upper - probs.gather(-1, drawn[..., None]).squeeze(-1)
    return torch.minimum(u - lower, upper - u)


@pytest.mark.slow  # inductor compiles C++ for each step shape: ~10-30 s on 2 cores
@pytest.mark.parametrize("known, targets", [(0, 4), (5, 1), (9, 3)],
                         ids=["first-step", "one-target", "parallel-targets"])
def test_a_compiled_step_gives_the_eager_logits_and_tokens_away_from_ties(known, targets):
    model = peaked_model()
    steps = {compiled: sampler_mid_generation(model, compiled, known, targets)
             for compiled in (False, True)}
    bucket = 1 << (targets - 1).bit_length()
    shape = (bucket, bucket, N)  # rows fed: the targets' (slots known..); keys: all N
    outputs = {}
    with torch.no_grad():
        for compiled, sampler in steps.items():
            logits, slots, valid = sampler.call(*shape)
            drawn = sampler.ordered.gather(1, slots.clamp(max=N - 1))
            outputs[compiled] = (logits.clone(), drawn, valid.clone())
    (eager, eager_drawn, valid), (compiled, compiled_drawn, _) = outputs[False], outputs[True]
    scale = eager.abs().max()
    assert (compiled - eager).abs().max() <= LOGIT_BOUND * scale
    slots = (known + torch.arange(shape[1])).clamp(max=N - 1)
    positions = steps[False].orders.gather(1, slots[None].expand(B, -1))
    u = steps[False].uniforms.gather(1, positions)
    clear = valid & (decision_margin(eager, eager_drawn, u) > 2 * LOGIT_BOUND * scale)
    assert clear.sum() >= valid.sum() // 2  # the comparison below is not empty
    assert torch.equal(compiled_drawn[clear], eager_drawn[clear])
    # the cache rows the step wrote are the eager step's too
    for layer in range(2):
        for ours, theirs in ((steps[True].cache.keys, steps[False].cache.keys),
                             (steps[True].cache.values, steps[False].cache.values)):
            assert ((ours[layer] - theirs[layer]).abs().max()
                    <= LOGIT_BOUND * theirs[layer].abs().max())


@pytest.mark.slow
def test_compiled_generation_compiles_each_step_shape_once_and_matches_eager():
    """Whole generations: the same tokens (top-k 3 at a low temperature keeps every draw far
    from a tie), and a second generation compiles nothing more."""
    model = peaked_model()
    config = SamplingConfig(steps=5, top_k=3, temperature=0.5, seed=4)
    eager = KVCacheSampler(model, B, N, config, compile=False).generate(torch.arange(B))
    compiled = KVCacheSampler(model, B, N, config, compile=True)
    counters.clear()
    first = compiled.generate(torch.arange(B))
    graphs = counters["stats"]["unique_graphs"]
    second = compiled.generate(torch.arange(B, 2 * B))
    assert graphs > 0 and counters["stats"]["unique_graphs"] == graphs  # no recompilation
    assert torch.equal(first.tokens, eager.tokens) and torch.equal(first.orders, eager.orders)
    assert not torch.equal(second.tokens, first.tokens)  # other samples: other tokens


def test_the_tables_follow_the_weights_when_they_change_in_place():
    """AdaLN tables are built once per sampler; an optimizer step or load_state_dict changes the
    weights in place, and the next generation uses the new ones."""
    model = peaked_model()
    config = SamplingConfig(steps=4, temperature=0.0)
    sampler = KVCacheSampler(model, B, N, config, compile=False)
    sampler.generate(torch.arange(B))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "adaLN" in name or "wtpe" in name:
                p.mul_(-3.0)
    fresh = KVCacheSampler(model, B, N, config, compile=False).generate(torch.arange(B))
    assert torch.equal(sampler.generate(torch.arange(B)).tokens, fresh.tokens)


# bf16's unit roundoff is 2^-9 ~ 2e-3. Eager rounds every op's output to bf16, inductor keeps
# fused intermediates in fp32 and rounds once: each of the ~20 rounded ops of two layers (norms,
# projections, attention, MLP, residual adds) may differ by an ulp, partly cancelling, ~1e-2 of
# the logits' scale; 3e-2 leaves room. A missed term still moves them by O(1).
BF16_LOGIT_BOUND = 3e-2


@pytest.mark.slow  # inductor compiles C++ for a bf16 step: ~30-60 s on 2 cores
def test_a_compiled_bf16_step_through_sdpa_with_a_bias_gives_the_eager_logits(monkeypatch):
    """A GPU's decode step: bf16, the parallel generation mask as an additive bias, through
    torch's SDPA, compiled. A CPU takes the plain computation for masked bf16 attention
    (attention.attend: its SDPA kernel is slow there); here the CPU is sent down the GPU's
    branch, the same call with the same arguments, so that inductor compiles what Triton gets."""
    from aogpt.model import attention

    plain, calls = attention.math_attention, []

    def sdpa_with_bias(q, k, v, mask=None):
        if isinstance(mask, torch.Tensor) and mask.dtype == q.dtype:  # attention_bias's bias
            calls.append(mask.dtype)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return plain(q, k, v, mask)

    monkeypatch.setattr(attention, "math_attention", sdpa_with_bias)
    model = peaked_model().to(torch.bfloat16)
    known, targets = 5, 3
    steps = {compiled: sampler_mid_generation(model, compiled, known, targets)
             for compiled in (False, True)}
    shape = (4, 4, N)
    outputs = {}
    with torch.no_grad():
        for compiled, sampler in steps.items():
            logits, slots, _ = sampler.call(*shape)
            outputs[compiled] = logits.clone(), sampler.ordered.gather(1, slots.clamp(max=N - 1))
    assert calls and set(calls) == {torch.bfloat16}  # both took the bias branch
    (eager, _), (compiled, compiled_drawn) = outputs[False], outputs[True]
    assert (compiled - eager).abs().max() <= BF16_LOGIT_BOUND * eager.abs().max()
    # the compiled step drew what its own logits ask for, with the same uniforms: its sampling
    # (fp32 softmax, float64 inverse CDF) fused into the graph, against eager code (a token can
    # differ only within fp32 rounding of a tie, ~1e-6 here)
    positions = steps[True].orders.gather(1, (known + torch.arange(4)).clamp(max=N - 1)[None]
                                          .expand(B, -1))
    u = steps[True].uniforms.gather(1, positions)
    valid = (torch.arange(4) < targets).expand(B, -1)
    expected = sample_from_logits(compiled, SamplingConfig(), u)
    assert torch.equal(compiled_drawn[valid], expected[valid])


# ---- CUDA graphs, emulated: what a replay does that an eager call does not -----------------------


class ReplayingSampler(KVCacheSampler):
    """The sampler's CUDA-graph path on a CPU: each call shape is captured once (make_fx, after
    the same warm-up run) and every later call of that shape replays the capture, which like a
    CUDA graph reads the sampler's tensors where they lie when it runs and keeps every value the
    host decided while capturing (a Python number, a tensor replaced rather than updated)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cuda_graphs = self.bucketed = True  # the GPU's path, on the CPU
        self.captures = 0

    def _capture(self, shape):
        from torch.fx.experimental.proxy_tensor import make_fx

        saved = self._snapshot()
        self._network_step(*shape)  # the warm-up run, undone as on a GPU
        self._restore(saved)
        saved = self._snapshot()
        graph = make_fx(lambda: self._network_step(*shape))()  # tracing runs the call: undone
        self._restore(saved)
        self.captures += 1
        return graph


REPLAYED = {"parallel": SamplingConfig(steps=5, seed=2),
            "binomial": SamplingConfig(steps=6, counts="binomial", top_k=5, seed=3),
            "speculative": SamplingConfig(sampler="speculative", draft=3, seed=4),
            "branched tree": SamplingConfig(sampler="speculative", draft=3, tree=3, tree_depth=2,
                                            seed=4),
            "pre-drafts": SamplingConfig(sampler="speculative", draft=3, tree=2, predraft=3,
                                         seed=4)}


@pytest.mark.parametrize("config", REPLAYED.values(), ids=REPLAYED.keys())
def test_replayed_calls_give_the_eager_tokens_over_whole_generations(config):
    """Two generations (the second replays the first's captures with other sample ids and a
    prompt), then another after the weights changed in place (an optimizer step)."""
    model = perturbed_float64_model(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=N,
                                                cond_dim=8))
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    eager = KVCacheSampler(model, B, N, config, cuda_graphs=False)
    replayed = ReplayingSampler(model, B, N, config, cuda_graphs=False)
    prompt, given = torch.zeros(B, N, dtype=torch.long), torch.zeros(B, N, dtype=torch.bool)
    prompt[:, :2], given[:, :2] = torch.tensor([464, 318]), True
    runs = [(torch.arange(B), None, None), (torch.arange(B, 2 * B), prompt, given)]
    for ids, tokens, mask in runs:
        expected = eager.generate(ids, tokens, mask)
        assert torch.equal(replayed.generate(ids, tokens, mask).tokens, expected.tokens)
    captures = replayed.captures
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "adaLN" in name or "lm_head" in name:
                p.mul_(-1.5)
    expected = eager.generate(torch.arange(B))
    assert torch.equal(replayed.generate(torch.arange(B)).tokens, expected.tokens)
    assert replayed.captures == captures  # the same shapes replayed: nothing captured again


# ---- a compiler that fails, and many shapes in one process ---------------------------------------


@pytest.mark.slow  # inductor tries its C++ compiler: ~30 s on 2 cores
def test_sample_py_with_a_broken_compiler_warns_once_and_samples_eagerly(tmp_path):
    torch.manual_seed(0)
    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=N, cond_dim=8)
    save_consolidated(tmp_path / "ckpt", config, AOGPT(config).state_dict(), None)
    env = {**os.environ, "CXX": "/bin/false", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}

    def sample(*flags):
        out = tmp_path / f"{flags[-1]}.jsonl"
        result = run_cli("trainer/sample.py", "--ckpt", str(tmp_path / "ckpt"), "--weights", "raw",
                         "--num-samples", "2", "--steps", "4", "--out", str(out), *flags, env=env)
        assert result.returncode == 0, result.stderr
        return [json.loads(line)["tokens"] for line in out.read_text().splitlines()], result

    compiled, result = sample("--compile", "on")
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "compiling the sampler's network call failed (InductorError" \
        in warnings[0] and warnings[0].endswith("sampling eagerly")
    assert compiled == sample("--compile", "off")[0]


def test_many_call_shapes_in_one_process_never_fail_a_generation(monkeypatch, capsys):
    """Samplers of many sequence lengths, compiled, in one process whose dynamo caps are far
    below their shapes' count and fail hard when reached (dynamo's own eager backend: the caps
    are dynamo's, not inductor's): each generation gives the eager tokens, and the process says
    once that it samples eagerly from then on."""
    from aogpt.model.sampler import engine

    monkeypatch.setattr(engine, "FAILED_FAST_PATHS", set())
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    model = peaked_model()
    config = SamplingConfig(steps=3, top_k=3, temperature=0.5)
    with torch._dynamo.config.patch(recompile_limit=2, accumulated_recompile_limit=4,
                                    fail_on_recompile_limit_hit=True):
        for n in range(6, N + 1):
            eager = KVCacheSampler(model, B, n, config).generate(torch.arange(B))
            compiled = KVCacheSampler(model, B, n, config, compile=True).generate(torch.arange(B))
            assert torch.equal(compiled.tokens, eager.tokens)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "FailOnRecompileLimitHit" in err
