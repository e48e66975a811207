"""Every kernel a piece of work launches, with the FLOPs and bytes of each: what
benchmarks/step_anatomy.py times against a GPU's roofline.

    census = KernelCensus()
    with census.compiling():        # inductor's caches off: what compiles here is recorded
        work()                      # the first call compiles
        with census:                # records the kernels of one more call
            with census.phase("forward"):
                work()
    census.kernels                  # [Kernel(name, phase, compiled, flops, bytes, ops), ...]

Two sources, one list in the order the work ran:

- compiled code: each kernel inductor generated and each library call it kept (a matmul, an
  attention), read from inductor's own scheduler after fusion. Bytes are the scheduler's count
  of each fused node's buffers read and written (BaseSchedulerNode.get_read_write_buffers_sizes,
  the count inductor's GPU benchmarking uses; its metrics.num_bytes_accessed stays 0 for C++
  kernels), FLOPs torch's flop formulas on the node's FX origin (matmuls and attention: the
  tensor-core work). A compiled graph is recorded once, when inductor writes it, and its
  kernels are listed each time it runs.
- eager code: each aten op a TorchDispatchMode sees outside compiled graphs (DeepSpeed, the
  optimizer, the loss's chunk loop, autograd's own ops), with the bytes of its real tensors
  (each read and each written once) and torch's flop formula where it has one. Views and
  allocations launch nothing and are left out.

The mode calls itself an infrastructure mode: dynamo runs no compiled code under a user's
dispatch mode (it falls back to eager, which would record the unfused ops), and skips the check
for infrastructure modes (torch.utils._python_dispatch.is_in_torch_dispatch_mode).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
import torch._functorch.config
import torch._inductor.config
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import (
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

aten = torch.ops.aten
# ops that move no data: they allocate, alias, or answer a question about metadata
NO_KERNEL = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
             aten.new_empty_strided, aten.detach, aten.alias, aten.lift_fresh, aten.set_,
             aten.resize_, aten.is_nonzero, aten.is_same_size, aten.promote_types,
             aten.result_type, aten._local_scalar_dense, aten.sym_size, aten.sym_stride,
             aten.sym_numel, aten.sym_storage_offset, aten.record_stream}
MATMULS = ("mm", "addmm", "bmm", "baddbmm")
# ops whose first argument is only written (its old values are not read)
WRITES_FIRST = {aten.copy_, aten.zero_, aten.fill_, aten.normal_, aten.uniform_, aten.random_,
                aten.bernoulli_, aten.exponential_}


@dataclass(frozen=True)
class Kernel:
    """One kernel launch (or a library call that launches `launches` kernels on a GPU)."""

    name: str  # inductor's kernel name, or the aten op
    phase: str  # what the work was doing when it ran (KernelCensus.phase)
    compiled: bool  # part of a compiled graph (inductor's), not an eager op
    flops: float
    bytes: float  # read + written
    ops: tuple[str, ...]  # the aten ops it computes (a fused kernel: several)
    extern: bool = False  # a library call (matmul, attention) rather than generated code
    reduction: tuple[int, int] | None = None  # a generated reduction's (outputs, reduced each)
    matmul: tuple[int, int, int, int] | None = None  # a matmul's (batch, M, N, K)
    micro: int = -1  # the micro-step it ran in (KernelCensus.micro), -1: outside any


def _cpu_flash_attention_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_flash_attention_backward_flops(grad_out, query, key, value, *args, out_shape=None,
                                        **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


@functools.cache
def _register_cpu_attention_flops() -> None:
    """torch counts the FLOPs of its GPU attention kernels, not of the CPU's flash attention,
    which a CPU's inductor keeps where a GPU's keeps those: the same formulas (attention counted
    whole, causal or not, as torch counts it)."""
    register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)(
        _cpu_flash_attention_flops)
    register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)(
        _cpu_flash_attention_backward_flops)


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes a kernel reads or writes of t: its elements, or its storage when it is smaller
    (an expanded view reads each stored value once)."""
    stored = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    return min(t.numel(), stored) * t.element_size()


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def eager_kernel(func, args, kwargs, out, phase: str) -> Kernel | None:
    """The kernel an eager aten op launches, or None for one that moves no data."""
    packet = func.overloadpacket
    if packet in NO_KERNEL or func.is_view or not _tensors(out):
        return None
    inputs = _tensors((args, kwargs))
    read = inputs[1:] if packet in WRITES_FIRST else inputs
    moved = sum(map(tensor_bytes, read)) + sum(map(tensor_bytes, _tensors(out)))
    name = str(packet).removeprefix("aten.")
    # an in-place matmul (addmm_: the loss's fp32 weight gradient) counts as its out-of-place op
    formula = flop_registry.get(getattr(aten, name.rstrip("_"), packet))
    flops = formula(*args, **kwargs, out_val=out) if formula is not None else 0
    shapes = [tuple(t.shape) for t in inputs]
    return Kernel(name, phase, False, float(flops), float(moved), (name,),
                  matmul=matmul_shape(name, shapes))


def matmul_shape(op: str, shapes: list[tuple[int, ...]]) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a matmul op from its inputs' shapes (addmm's bias first), else None."""
    op = op.split(".")[0].rstrip("_")
    if op not in MATMULS:
        return None
    a, b = shapes[-2:] if op in ("addmm", "baddbmm") else shapes[:2]
    batch = a[0] if len(a) == 3 else 1
    return (batch, a[-2], b[-1], a[-1])


class KernelCensus(TorchDispatchMode):
    """Records the kernels of the work run inside it (see the module's docstring)."""

    def __init__(self):
        super().__init__()
        _register_cpu_attention_flops()
        _InductorHooks.install()
        self.kernels: list[Kernel] = []
        self._phase = "other"
        self.micro = -1  # which micro-step the work is in (set by the caller), -1: none
        self._inside_graph = 0

    @classmethod
    def is_infra_mode(cls) -> bool:
        return True  # so that dynamo runs compiled graphs under it (see the module's docstring)

    @staticmethod
    @contextlib.contextmanager
    def compiling() -> Iterator[None]:
        """Inductor writes every graph compiled inside (no cached graph skips its scheduler),
        its kernels in the order of the graph rather than reordered by buffer sizes for peak
        memory (so that the kernels of one step at two sizes come in the same order)."""
        with (torch._inductor.config.patch(fx_graph_cache=False, autotune_local_cache=False,
                                           reorder_for_peak_memory=False),
              torch._functorch.config.patch(enable_autograd_cache=False)):
            yield

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Kernels launched inside are marked `name` (nested: the innermost)."""
        before, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = before

    def enter_phase(self, name: str) -> str:
        """Sets the phase without a block (autograd hooks), returning the one it replaces."""
        before, self._phase = self._phase, name
        return before

    def __enter__(self):
        _InductorHooks.active.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _InductorHooks.active.remove(self)
        return super().__exit__(*exc)

    @contextlib.contextmanager
    def substituted(self, kernel: Kernel) -> Iterator[None]:
        """What runs inside is recorded as `kernel` (what a GPU runs where a CPU takes another
        path to the same numbers)."""
        if self in _InductorHooks.active:  # recording (not a warm-up outside `with census`)
            self.kernels.append(replace(kernel, phase=self._phase, micro=self.micro))
        self._inside_graph += 1
        try:
            yield
        finally:
            self._inside_graph -= 1

    def graph_ran(self, kernels: list[Kernel]) -> None:
        self.kernels += [replace(k, phase=self._phase, micro=self.micro) for k in kernels]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self._inside_graph:
            kernel = eager_kernel(func, args, kwargs, out, self._phase)
            if kernel is not None:
                self.kernels.append(replace(kernel, micro=self.micro))
        return out


class _InductorHooks:
    """Wraps inductor's methods, once per process: the scheduler's code generation (each
    kernel's nodes, bytes and FLOPs), and a compiled graph's construction and call (its kernels,
    listed in the active census at each call)."""

    active: list[KernelCensus] = []
    installed = False

    @classmethod
    def install(cls) -> None:
        if cls.installed:
            return
        from torch._inductor.output_code import CompiledFxGraph
        from torch._inductor.scheduler import Scheduler

        cls._wrap(Scheduler, "_codegen", _record_scheduled)
        cls._wrap(CompiledFxGraph, "__init__", _keep_graph_kernels)
        cls._wrap(CompiledFxGraph, "__call__", _list_graph_kernels)
        cls.installed = True

    @staticmethod
    def _wrap(owner, name: str, wrapper) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapped(self, *args, **kwargs):
            return wrapper(original, self, *args, **kwargs)

        setattr(owner, name, wrapped)


def _record_scheduled(original, scheduler, nodes):
    """The scheduler's final nodes, after fusion: one kernel each (a no-op node: none)."""
    from torch._inductor.virtualized import V

    graph = V.graph  # a graph split in partitions comes here once per partition, in order
    if not hasattr(graph, "_census_kernels"):
        graph._census_kernels = []
    kernels = (_scheduled_kernel(node) for node in nodes)
    graph._census_kernels += [kernel for kernel in kernels if kernel is not None]
    return original(scheduler, nodes)


def _scheduled_kernel(node) -> Kernel | None:
    from torch._inductor import ir
    from torch._inductor.fx_utils import count_flops_fx, countable_fx
    from torch._inductor.scheduler import NopKernelSchedulerNode
    from torch._inductor.utils import get_fused_kernel_name
    from torch._inductor.virtualized import V

    if isinstance(node, NopKernelSchedulerNode) or isinstance(node.node, ir.MultiOutput):
        return None  # no kernel: a no-op, or the outputs of a library call taken apart
    members = node.get_nodes()
    origins = {origin for member in members if member.node is not None
               for origin in member.node.get_origins()
               if isinstance(origin.target, torch._ops.OpOverload)}
    ops = tuple(sorted({str(origin.target).removeprefix("aten.") for origin in origins}))
    moved = float(_extern_bytes(node) if node.is_extern() else _bytes_moved(node, members))
    if node.is_extern():
        kernel = getattr(node.node, "python_kernel_name", None) or node.get_name()
        name = kernel.removeprefix("extern_kernels.").removeprefix("torch.ops.aten.")
        flops = sum(count_flops_fx(o) or 0 for o in origins if countable_fx(o))
        shapes = [tuple(V.graph.sizevars.optimization_hints(i.get_size()))
                  for i in node.node.inputs if hasattr(i, "get_size")]
        return Kernel(name, "", True, float(flops), moved, ops, extern=True,
                      matmul=matmul_shape(name, shapes))
    # named as a GPU's Triton kernel is, by the aten ops it fuses (the C++ function the CPU
    # writes may hold several such kernels, grouped by sizes)
    name = get_fused_kernel_name(members, "original_aten")
    numel, reduced = (_count(part) for part in node.group[1])  # (outputs, reduced each)
    return Kernel(name, "", True, 0.0, moved, ops,
                  reduction=(numel, reduced) if reduced > 1 else None)


def _bytes_moved(node, members: list) -> int:
    """The bytes a kernel reads and writes: inductor's count for the fused node (each buffer
    once, those that live only inside the kernel left out), each buffer capped at what its
    members' own counts give. Inductor counts a fused node's every buffer whole, which for a
    scatter into a big buffer (a KV cache's new rows) is the whole cache where the members' count
    is the rows written."""
    fused = node.get_read_write_buffer_accesses(include_reads=True, include_writes=True)
    if len(members) == 1:
        return sum(fused.values())
    own: dict[str, int] = {}
    for member in members:
        for name, size in member.get_read_write_buffer_accesses(
                include_reads=True, include_writes=True).items():
            own[name] = own.get(name, 0) + size
    return sum(min(size, own.get(name, size)) for name, size in fused.items())


def _extern_bytes(node) -> int:
    """A library call's bytes: its inputs as it sees them (views: the visible slots of a KV
    cache, not the whole cache inductor would count) and the buffers it writes."""
    from torch._inductor.utils import get_dtype_size, sympy_product
    from torch._inductor.virtualized import V

    read = sum(V.graph.sizevars.optimization_hint(sympy_product(i.get_size()), fallback=0)
               * get_dtype_size(i.get_dtype())
               for i in node.node.inputs if hasattr(i, "get_size") and hasattr(i, "get_dtype"))
    written = node.get_read_write_buffer_accesses(include_reads=False, include_writes=True)
    return read + sum(written.values())


def _count(sizes) -> int:
    """A group's size (a C++ kernel's group holds the loop ranges, a Triton kernel's their
    product) as a number."""
    from torch._inductor.utils import sympy_product
    from torch._inductor.virtualized import V

    expr = sympy_product(sizes) if isinstance(sizes, (tuple, list)) else sizes
    return int(V.graph.sizevars.optimization_hint(expr, fallback=1))


def _keep_graph_kernels(original, graph, *args, **kwargs):
    original(graph, *args, **kwargs)
    lowering = kwargs.get("graph", args[1] if len(args) > 1 else None)
    graph._census_kernels = getattr(lowering, "_census_kernels", None)


def _list_graph_kernels(original, graph, inputs):
    census = _InductorHooks.active[-1] if _InductorHooks.active else None
    if census is None:
        return original(graph, inputs)
    if graph._census_kernels is None:
        raise RuntimeError("a compiled graph ran that was compiled outside "
                           "KernelCensus.compiling(): its kernels are unknown")
    census.graph_ran(graph._census_kernels)
    census._inside_graph += 1
    try:
        return original(graph, inputs)
    finally:
        census._inside_graph -= 1
