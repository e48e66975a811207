"""benchmarks/step_anatomy.py and its parts: the kernel census counts the FLOPs the model's
arithmetic says a step does, a step read at a larger micro-batch from two small ones is the
step recorded there, the roofline's model of a GPU behaves as its constants say, and the
committed anatomies (docs/step-anatomy*.json) hold what the issue asks of them."""

import json
import sys
from dataclasses import replace

import pytest
import torch
from conftest import REPO

from aogpt.model import AOGPT
from aogpt.model.config import tiny

sys.path.insert(0, str(REPO / "benchmarks"))
import anatomy  # noqa: E402
import roofline  # noqa: E402
from kernel_census import Kernel, KernelCensus  # noqa: E402

SEQ = 128  # tiny's block size
# the committed anatomies (made by step_anatomy.py on a CPU: minutes each, not a test's)
ANATOMIES = ["step-anatomy.json", "step-anatomy-medium.json", "step-anatomy-decode.json",
             "step-anatomy-network.json"]
UNMEASURED = {"step-anatomy-network.json"}  # a lever's prediction: no GPU has run it yet
# tiny with a vocabulary of 512, so that the head does not outweigh the blocks' FLOPs (with
# GPT-2's 50K it is 97% of them, and a miscounted block would hide within 2%)
SMALL_VOCAB = replace(tiny(), vocab_size=512)


def eager_step_kernels(model: AOGPT, micro: int) -> list[Kernel]:
    """The kernels of one forward and backward of `micro` sequences, as the trainer runs them."""
    generator = torch.Generator().manual_seed(micro)
    seq = model.config.block_size
    idx = torch.randint(0, model.config.vocab_size, (micro, seq), generator=generator)
    orders = torch.rand(micro, seq, generator=generator).argsort(dim=1)
    census = KernelCensus()
    with census:
        _, loss = model(idx, orders, return_mean=True)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return census.kernels


def test_the_counted_matmul_and_attention_flops_per_token_are_the_models_arithmetic():
    """6N + 12 L d T per token (AOGPT.flops_per_token), but for two things that arithmetic
    counts and no matmul computes, the biases and norm weights in N and the AdaLN projections of
    every token (a step projects the block_size target codes once per micro-batch,
    AOGPT.adaln_tables: 1/8 of the tokens here), and one it leaves out: flash attention's
    backward computes the scores again (torch counts it as 2.5 forwards, as FlashAttention-2's
    benchmarks do; 12 L d T as 2), 2 L d T more. Read at 8 sequences from 2 and 3."""
    torch.manual_seed(0)
    model = AOGPT(SMALL_VOCAB)
    micro = 8
    kernels = anatomy.extrapolate(eager_step_kernels(model, 2), eager_step_kernels(model, 3),
                                  micro)
    counted = anatomy.matmul_attention_flops(kernels) / (micro * SEQ)
    params = dict(model.named_parameters())
    vectors = sum(p.numel() for p in params.values() if p.dim() == 1)
    adaln = sum(p.numel() for name, p in params.items() if "adaLN" in name and p.dim() == 2)
    rows_per_token = SEQ / (micro * SEQ)
    c = model.config
    expected = (model.flops_per_token(SEQ) - 6 * vectors - 6 * adaln * (1 - rows_per_token)
                + 2 * c.n_layer * c.n_embd * SEQ)
    assert counted == pytest.approx(expected, rel=0.02)
    assert abs(counted / model.flops_per_token(SEQ) - 1) > 0.02  # the corrections matter here


def test_a_step_read_at_five_sequences_from_two_and_three_is_the_step_recorded_at_five():
    torch.manual_seed(0)
    model = AOGPT(replace(SMALL_VOCAB, n_layer=1, block_size=32, vocab_size=64))
    read = anatomy.extrapolate(eager_step_kernels(model, 2), eager_step_kernels(model, 3), 5)
    recorded = eager_step_kernels(model, 5)
    assert [k.name for k in read] == [k.name for k in recorded]
    assert [(k.flops, k.bytes) for k in read] == [(k.flops, k.bytes) for k in recorded]


def test_recordings_that_list_different_kernels_are_not_extrapolated():
    one = [Kernel("mm", "forward", False, 1.0, 1.0, ("mm",))]
    two = [Kernel("addmm", "forward", False, 2.0, 2.0, ("addmm",))]
    with pytest.raises(RuntimeError, match="differ between its two recordings"):
        anatomy.extrapolate(one, two, 16)


def matmul(m: int, n: int, k: int) -> Kernel:
    return Kernel("mm", "forward", True, 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), ("mm",),
                  extern=True, matmul=(1, m, n, k))


def test_a_matmul_of_whole_waves_runs_at_the_gpus_achievable_matmul_rate():
    gpu = roofline.GPUS["H100"]
    # 132 SMs: 12 x 11 tiles of 128 x 256 fill one wave exactly
    kernel = matmul(12 * 128, 11 * 256, 8192)
    assert roofline.wave_efficiency(gpu, kernel.matmul) == 1.0
    seconds = roofline.roofline_seconds(kernel, gpu, causal=False)
    assert seconds == pytest.approx(kernel.flops / gpu.matmul_flops)


def test_a_matmul_one_tile_past_a_wave_pays_for_a_second_wave():
    gpu = roofline.GPUS["H100"]
    assert roofline.wave_efficiency(gpu, (1, 12 * 128 + 1, 11 * 256, 8192)) == pytest.approx(
        143 / 264)  # 13 x 11 tiles on 2 x 132 SMs


def test_kernels_shorter_than_a_launch_leave_the_device_waiting_for_the_host():
    gpu = roofline.GPUS["H100"]
    tiny_kernel = Kernel("add", "forward", False, 0.0, 1024.0, ("add",))
    eager = roofline.sequence_seconds([tiny_kernel] * 100, gpu, causal=False, in_graph=False)
    graph = roofline.sequence_seconds([tiny_kernel] * 100, gpu, causal=False, in_graph=True)
    assert eager == pytest.approx(100 * roofline.HOST_LAUNCH_S)
    assert graph == pytest.approx(100 * roofline.kernel_seconds(tiny_kernel, gpu, False))


@pytest.mark.parametrize("name", ANATOMIES)
def test_the_committed_anatomies_hold_the_prediction_its_classes_and_kernels(name):
    """What the issue asks of the anatomy's JSON (benchmarks/step_anatomy.py --json), in the
    files docs/performance.md quotes; each with the validation against the GPU report."""
    data = json.loads((REPO / "docs" / name).read_text())
    decode = data["what"] == "decode call"
    headline = ["predicted_call_ms", "kernels_per_call"] if decode else [
        "predicted_mfu", "predicted_mfu_causal", "predicted_step_s"]
    assert all(data[key] > 0 for key in headline)
    assert set(data["classes"]) == set(roofline.CLASSES)
    for row in data["classes"].values():
        assert set(row) >= {"kernels", "flops", "bytes", "predicted_s"}
    assert sum(row["kernels"] for row in data["classes"].values()) == data["kernels_per_step"]
    assert all(set(k) >= {"name", "class", "flops", "bytes", "predicted_s"}
               for k in data["kernels"])
    assert set(data["validation"]) >= {"configuration", "predicted", "measured", "source"}
    measured = data["validation"]["measured"]  # by the H200 report, but for a lever's
    assert measured is None if name in UNMEASURED else measured > 0
    assert set(data["by_gpu"]) == set(roofline.GPUS)  # what a GPU report sets beside its own


@pytest.mark.parametrize("name, expected", [
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_TNT", "matmul"),  # cuBLAS >= 12.8 on Hopper
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_"
     "segment_k_off_kernel__5x_cublas", "matmul"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, "
     "false, cutlass::bfloat16_t>>(pytorch_flash::Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<"
     "cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
     "attention"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
     "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor"
     "<float, 4, (at::native::ADAM_MODE)1, false>>", "optimizer + EMA"),
    ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm + AdaLN"),
    ("triton_red_fused_logsumexp_sub_3", "loss"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, "
     "2, 2, -2, true>", "orders/gathers"),
    # autograd's gradient accumulation, eager: the census's add_ (AFFINE_OPS), not "other"
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
     "norm + AdaLN"),
    ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::"
     "func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()("
     "at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >", "norm + AdaLN"),
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*, "
     "void*, void*, unsigned int)", "attention"),
])
def test_a_gpu_profiles_kernels_are_classed_as_the_census_classes_them(name, expected):
    """The profiler's time per class (the GPU report's column beside the prediction) is only as
    good as the class each kernel name gets: a matmul counted as "other" would read as the
    anatomy overestimating the matmuls."""
    assert roofline.gpu_kernel_class(name) == expected
