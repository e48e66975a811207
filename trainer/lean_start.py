"""What a training rank would pay at start for features it does not use, and does not.

Each of these cost every rank of every launch (the project's 2-core CPU machine): a user's CPU
run and a GPU rank's start-up alike, and every multi-process test. Each leaves the feature whole
for the run that uses it. init_process_group (dist_env.py) applies them all, before the engine
and its optimizer are built.
"""

from __future__ import annotations

import functools
import sys

import torch


def skip_unused_costs(deepspeed) -> None:
    _without_inference_all_reduce(deepspeed)
    _muon_compiled_when_called()
    _optimizers_load_dynamo_only_when_compiling()


def _without_inference_all_reduce(deepspeed) -> None:
    """DeepSpeed's CPU backend (0.19.8) builds a C++ op at init_distributed for one collective,
    inference_all_reduce, which only its inference tensor parallelism calls: it compiles for
    ~80 s on 2 cores the first time on each machine and torch environment (and again whenever
    two environments take turns), and gives each rank a 66 MiB /dev/shm workspace that it never
    unlinks. Training all-reduces through the process group, so the op is marked unbuildable here,
    as on a platform without it: init_distributed then skips both."""
    builder = deepspeed.get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def _muon_compiled_when_called() -> None:
    """DeepSpeed (0.19.8) imports its Muon optimizer's module in every engine, to ask whether the
    optimizer is Muon, and that module wraps three functions in torch.compile as it is imported:
    wrapping loads dynamo's compiler and inductor, ~2 s of CPU in every rank of every launch,
    compiled or eager, though only a Muon run ever calls them. Here the module's decorator
    (deepspeed.runtime.compiler.compile, used by nothing else) wraps a function in torch.compile
    at its first call instead: the same compiled function for a Muon run, no cost for the rest."""
    from deepspeed.runtime import compiler

    def compile():
        def decorate(function):
            compiled = None

            @functools.wraps(function)
            def call(*args, **kwargs):
                nonlocal compiled
                if compiled is None:
                    compiled = torch.compile(function)
                return compiled(*args, **kwargs)

            return call

        return decorate

    compiler.compile = compile


# torch.optim.Optimizer's methods that torch (2.13) wraps in torch._disable_dynamo
OPTIMIZER_METHODS_WITHOUT_DYNAMO = ("add_param_group", "state_dict", "load_state_dict", "zero_grad")


def _optimizers_load_dynamo_only_when_compiling() -> None:
    """torch (2.13) imports dynamo, ~2.3 s of CPU, in every process that builds and steps an
    optimizer, compiled or eager: four methods of every optimizer are wrapped in
    torch._disable_dynamo (which imports dynamo at its first call, to keep a compiled region
    from tracing into them), and Adam's step (AdamW's too) graph-breaks before and after the
    update. Nothing traces in a process that never loaded dynamo, so until something loads it (a
    compiled run) each runs as it is; from then on, as torch has it. Where torch's wrappers are
    not the ones described here (another version), they are left as they are."""
    for name in OPTIMIZER_METHODS_WITHOUT_DYNAMO:
        wrapper = getattr(torch.optim.Optimizer, name)
        function = getattr(wrapper, "__wrapped__", None)
        if function is not None:  # torch._disable_dynamo's wrapper asks this attribute first
            function.__dynamo_disable = _as_is_until_dynamo_loads(wrapper, function)
    step = torch.optim.Adam.__dict__.get("step")
    if getattr(getattr(step, "__code__", None), "co_name", None) == "_use_grad" and hasattr(
            step, "__wrapped__"):
        torch.optim.Adam.step = _graph_breaks_only_under_dynamo(step.__wrapped__)


def _as_is_until_dynamo_loads(wrapper, function):
    @functools.wraps(function)
    def call(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return function(*args, **kwargs)
        del function.__dynamo_disable  # torch's wrapper makes its own from here on, as it would
        return wrapper(*args, **kwargs)

    return call


def _graph_breaks_only_under_dynamo(step):
    """torch's wrapper of an optimizer's step (_use_grad_for_differentiable: gradients on only
    for a differentiable optimizer), with its graph breaks only where dynamo is loaded."""

    @functools.wraps(step)
    def call(self, *args, **kwargs):
        dynamo = sys.modules.get("torch._dynamo")
        enabled = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            if dynamo is not None:
                dynamo.graph_break()
            return step(self, *args, **kwargs)
        finally:
            if dynamo is not None:
                dynamo.graph_break()
            torch.set_grad_enabled(enabled)

    return call
