"""trainer/sync_free.py against the DeepSpeed it patches: the functions it replaces are the ones
it was written for (their source pinned by hash, and DeepSpeed still calls each where it did,
so no new call site escapes the patch), and each replacement gives what the original gives on a
grid of gradient norms, in fp32 and bf16. What a run does with a non-finite gradient norm (the
trainer's check at the next boundary) is tested by real runs in test_trainer_syncs.py."""

import ast
from pathlib import Path

import deepspeed
import pytest
import torch
from deepspeed.runtime import bf16_optimizer, utils
from deepspeed.runtime.zero import stage3, stage_1_and_2
from device_syncs import SyncLog, _Reads

from aogpt.trainer import sync_free
from aogpt.trainer.recovery import FirstNonFinite

# Every function of DeepSpeed 0.19.8 that calls one of the replaced names. Those in the modules
# install() patches run the replacements; the others (fp16, ZenFlow, SuperOffload optimizers, and
# helpers of utils.py that read host numbers) are paths our ZeRO-1/2/3 bf16 and fp32 steps never
# take.
CALLERS = {
    "runtime/bf16_optimizer.py": {
        "BF16_Optimizer.step": {"clip_tensors_by_global_norm", "is_invalid_grad_norm"}},
    "runtime/zero/stage_1_and_2.py": {
        "DeepSpeedZeroOptimizer.get_grad_norm_direct": {"mask_nan_or_inf_with_val_inplace"},
        "DeepSpeedZeroOptimizer.step": {"is_invalid_grad_norm"},
        "DeepSpeedZeroOptimizer.unscale_and_clip_grads": {"is_invalid_grad_norm"}},
    "runtime/zero/stage3.py": {
        "DeepSpeedZeroOptimizer_Stage3.complete_grad_norm_calculation_for_cpu_offload":
            {"mask_nan_or_inf_with_val_inplace"},
        "DeepSpeedZeroOptimizer_Stage3.step": {"is_invalid_grad_norm"}},
    "runtime/utils.py": {
        "get_global_norm_of_tensors": {"mask_nan_or_inf_with_val_inplace"},
        "CheckOverflow.check_using_norm": {"is_invalid_grad_norm"},
        "get_global_norm": {"is_invalid_grad_norm"},
        "get_norm_with_moe_layers": {"is_invalid_grad_norm"}},
    "runtime/fp16/fused_optimizer.py": {"FP16_Optimizer.step": {"is_invalid_grad_norm"},
                                        "FP16_Optimizer.step_fused_adam": {"is_invalid_grad_norm"}},
    "runtime/fp16/unfused_optimizer.py": {
        "FP16_UnfusedOptimizer.step": {"is_invalid_grad_norm"},
        "FP16_UnfusedOptimizer.step_fused_lamb": {"is_invalid_grad_norm"}},
    "runtime/superoffload/superoffload_stage3.py": {
        "SuperOffloadOptimizer_Stage3.step": {"is_invalid_grad_norm"}},
    "runtime/zenflow/engine_stage3.py": {"step": {"is_invalid_grad_norm"}},
    "runtime/zenflow/zenflow_stage_1_and_2.py": {
        "ZenFlowZeroOptimizerParallel.step": {"is_invalid_grad_norm"}},
}
# the modules install() patches, and the names each of them must then hold as ours: every name
# that CALLERS has them call (utils.py's own helpers besides get_global_norm_of_tensors read
# host numbers)
PATCHED = {bf16_optimizer: {"clip_tensors_by_global_norm", "is_invalid_grad_norm"},
           stage_1_and_2: {"is_invalid_grad_norm", "mask_nan_or_inf_with_val_inplace"},
           stage3: {"is_invalid_grad_norm", "mask_nan_or_inf_with_val_inplace"},
           utils: {"mask_nan_or_inf_with_val_inplace"}}
MAX_NORM = 1.0
# the gradient norms of the grid: 0, tiny, below, at and above max_norm, huge, DeepSpeed's
# invalid marker, and the non-finite ones
NORMS = [0.0, 1e-30, 0.5, MAX_NORM, 3.0, 1e30, -1.0, float("inf"), float("nan")]
DTYPES = [torch.float32, torch.bfloat16]


def callers_in_deepspeed() -> dict[str, dict[str, set[str]]]:
    """{file: {function's qualified name: the replaced names it calls}} over DeepSpeed's source."""
    root = Path(deepspeed.__file__).parent
    found = {}

    def visit(node, prefix: str, path: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", path)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                called = {c.func.id for c in ast.walk(child)
                          if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
                if replaced := called & set(sync_free.REPLACED):
                    found.setdefault(path, {})[prefix + child.name] = replaced
                visit(child, f"{prefix}{child.name}.", path)

    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        if any(name in source for name in sync_free.REPLACED):
            visit(ast.parse(source), "", str(path.relative_to(root)))
    return found


def test_the_replaced_functions_are_the_deepspeed_code_the_replacements_were_written_for():
    assert deepspeed.__version__ == sync_free.PATCHED_VERSION
    assert sync_free.changed_since_pinned() == []


def test_deepspeed_calls_each_replaced_function_where_it_did():
    assert callers_in_deepspeed() == CALLERS


def test_install_replaces_the_names_in_every_module_of_a_zero_step():
    sync_free.install()
    ours = {"mask_nan_or_inf_with_val_inplace": sync_free._mask_nan_or_inf_with_val_inplace,
            "is_invalid_grad_norm": sync_free._is_invalid_grad_norm_on_host,
            "clip_tensors_by_global_norm": sync_free._clip_tensors_by_global_norm}
    for module, names in PATCHED.items():
        for name in names:
            assert getattr(module, name) is ours[name], f"{module.__name__}.{name}"
    # what utils' own helpers still call, and the originals kept, are DeepSpeed's
    assert utils.is_invalid_grad_norm is sync_free.originals()["is_invalid_grad_norm"]
    assert sync_free.originals()["is_invalid_grad_norm"].__module__ == "deepspeed.runtime.utils"


def test_the_originals_wait_for_the_device_and_the_replacements_never_do():
    """What the patch is for, recorded as the CPU training runs record it (device_syncs.py):
    each original reads the norm on the host or copies host data to the device; no
    replacement does."""
    def waits(name: str, function) -> list[str]:
        log, norm = SyncLog(), torch.tensor(3.0)
        with _Reads(log):
            if name == "clip_tensors_by_global_norm":
                function([torch.ones(3)], max_norm=1.0, global_norm=norm)
            elif name == "mask_nan_or_inf_with_val_inplace":
                function(norm, device=norm.device)
            else:
                function(norm)
        return [event["kind"] for event in log.events]

    ours = {"mask_nan_or_inf_with_val_inplace": sync_free._mask_nan_or_inf_with_val_inplace,
            "is_invalid_grad_norm": sync_free._is_invalid_grad_norm_on_host,
            "clip_tensors_by_global_norm": sync_free._clip_tensors_by_global_norm}
    for name, original in sync_free.originals().items():
        assert waits(name, original), name
        assert waits(name, ours[name]) == [], name


def norm_tensor(norm: float, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(norm, dtype=dtype)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bits, so that NaNs compare equal to themselves."""
    return tensor.view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[tensor.dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", NORMS, ids=str)
def test_marking_a_non_finite_norm_gives_the_originals_bits(norm, dtype):
    original, replaced = norm_tensor(norm, dtype), norm_tensor(norm, dtype)
    sync_free.originals()["mask_nan_or_inf_with_val_inplace"](original, device=original.device)
    sync_free._mask_nan_or_inf_with_val_inplace(replaced, device=replaced.device)
    assert torch.equal(bits(replaced), bits(original))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", NORMS, ids=str)
def test_clipping_gives_the_originals_gradients_bit_for_bit(norm, dtype):
    generator = torch.Generator().manual_seed(0)
    gradients = [torch.randn(shape, generator=generator).to(dtype) for shape in ((7, 5), (3,))]
    original = [g.clone() for g in gradients]
    replaced = [g.clone() for g in gradients]
    kept = sync_free.originals()["clip_tensors_by_global_norm"](
        original, max_norm=MAX_NORM, global_norm=norm_tensor(norm, torch.float32))
    returned = sync_free._clip_tensors_by_global_norm(
        replaced, max_norm=MAX_NORM, global_norm=norm_tensor(norm, torch.float32))
    for ours, theirs in zip(replaced, original, strict=True):
        assert torch.equal(bits(ours), bits(theirs))
    assert torch.equal(bits(returned), bits(kept))
    if 0 < norm < MAX_NORM or norm != norm:  # no clipping due: untouched, bit for bit
        assert all(torch.equal(bits(g), bits(r)) for g, r in zip(gradients, replaced, strict=True))


@pytest.mark.parametrize("norm", NORMS, ids=str)
def test_clipping_by_a_host_number_is_the_originals(norm):
    gradients = [torch.randn(4, 3, generator=torch.Generator().manual_seed(1))]
    original, replaced = [g.clone() for g in gradients], [g.clone() for g in gradients]
    sync_free.originals()["clip_tensors_by_global_norm"](original, MAX_NORM, norm)
    sync_free._clip_tensors_by_global_norm(replaced, MAX_NORM, norm)
    assert torch.equal(bits(replaced[0]), bits(original[0]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", NORMS, ids=str)
def test_a_norm_deepspeed_calls_invalid_is_a_bad_step_for_the_trainer(norm, dtype):
    """The replacement leaves a device norm to the trainer: its check must call bad exactly the
    norms the original would have skipped a step for; host numbers are judged as before."""
    invalid = sync_free.originals()["is_invalid_grad_norm"](norm_tensor(norm, dtype))
    assert sync_free._is_invalid_grad_norm_on_host(norm_tensor(norm, dtype)) is False
    watch = FirstNonFinite(torch.device("cpu"))
    watch.note(3, torch.ones(4, dtype=torch.float64), norm_tensor(norm, dtype))
    assert watch.check() == (None, 3 if invalid else None)
    assert sync_free._is_invalid_grad_norm_on_host(norm) == \
        sync_free.originals()["is_invalid_grad_norm"](norm)
