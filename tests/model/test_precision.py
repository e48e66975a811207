"""auto precision: bf16 only where the hardware runs it natively, read from /proc/cpuinfo."""

import re

import pytest
import torch

from aogpt import UsageError
from aogpt.model.precision import (
    auto_dtype,
    cpu_has_native_bf16,
    reproducible_dtype,
    resolve_device,
    training_precision,
)

COMMON = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 ssse3 sse4_1 sse4_2 avx f16c"
FLAGS = {
    "avx2": f"{COMMON} fma avx2 bmi1 bmi2",
    "avx512_bf16": f"{COMMON} avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16",
    "amx": f"{COMMON} avx2 avx512f avx512_fp16 amx_bf16 amx_tile amx_int8",
}


def write_cpuinfo(tmp_path, flags: str, processors: int = 2):
    blocks = [f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: Some CPU\n"
              f"flags\t\t: {flags}\nbugs\t\t: spectre_v1\n" for i in range(processors)]
    path = tmp_path / "cpuinfo"
    path.write_text("\n".join(blocks))
    return path


@pytest.mark.parametrize(("cpu", "native"), [("avx2", False), ("avx512_bf16", True), ("amx", True)])
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path, cpu, native):
    assert cpu_has_native_bf16(write_cpuinfo(tmp_path, FLAGS[cpu])) is native


def test_unknown_cpu_flags_mean_no_native_bf16(tmp_path):
    assert cpu_has_native_bf16(tmp_path / "absent") is False
    (tmp_path / "aarch64").write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_has_native_bf16(tmp_path / "aarch64") is False


@pytest.mark.parametrize(("cpu", "dtype"), [("avx2", torch.float32),
                                            ("avx512_bf16", torch.bfloat16),
                                            ("amx", torch.bfloat16)])
def test_auto_dtype_on_a_cpu_is_bf16_only_with_native_bf16(tmp_path, cpu, dtype):
    assert auto_dtype(torch.device("cpu"), write_cpuinfo(tmp_path, FLAGS[cpu])) == dtype


def test_auto_dtype_on_a_gpu_is_bf16(tmp_path):
    cpuinfo = write_cpuinfo(tmp_path, FLAGS["avx2"])
    assert auto_dtype(torch.device("cuda", 0), cpuinfo) == torch.bfloat16


@pytest.mark.parametrize("cpu", list(FLAGS))
def test_reproducible_runs_are_fp32_on_every_cpu_and_bf16_on_a_gpu(tmp_path, cpu):
    """Unlike auto_dtype, training's and sample.py's "auto" read no CPU flags: a CPU run
    computes the same on every CPU."""
    fastest = auto_dtype(torch.device("cpu"), write_cpuinfo(tmp_path, FLAGS[cpu]))
    assert fastest == (torch.float32 if cpu == "avx2" else torch.bfloat16)
    assert reproducible_dtype(torch.device("cpu")) == torch.float32
    assert training_precision(torch.device("cpu")) == "fp32"
    assert reproducible_dtype(torch.device("cuda", 1)) == torch.bfloat16
    assert training_precision(torch.device("cuda", 1)) == "autocast_bf16"


def test_auto_device_is_the_processs_own_else_the_gpu_else_the_cpu():
    any_gpu = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("auto") == any_gpu
    assert resolve_device("auto", own=torch.device("cpu")) == torch.device("cpu")
    assert resolve_device("cpu", own=torch.device("cuda", 3)) == torch.device("cpu")
    assert resolve_device("meta") == torch.device("meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without GPU")
@pytest.mark.parametrize(("name", "message"), [
    ("gpu", "--device gpu is not a device: use auto, cpu, cuda or cuda:N"),
    ("cuda", "--device cuda: no CUDA GPU is visible here; use --device cpu"),
    ("cuda:1", "--device cuda:1: no CUDA GPU is visible here; use --device cpu"),
])
def test_a_device_that_is_not_there_is_a_usage_error(name, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without GPU")
def test_a_device_setting_is_named_as_its_command_takes_it():
    """lm-eval's model args say device=cuda, not a flag: the library names what it is given."""
    with pytest.raises(UsageError, match=re.escape("device=cuda: no CUDA GPU is visible here; "
                                                   "use device=cpu")):
        resolve_device("cuda", setting="device=")
