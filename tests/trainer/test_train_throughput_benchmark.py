"""benchmarks/train_throughput.py runs the real trainer on a tiny size and reports both rates."""

import re

from conftest import run_cli
from trainer_testing import SEQ_LEN, build_data, real_documents


def test_benchmark_reports_step_and_loader_rates_and_their_ratio(tmp_path):
    data = build_data(tmp_path / "data", real_documents())
    result = run_cli("benchmarks/train_throughput.py", "--ds_config", "ds_configs/cpu.json",
                     "--config", "configs/tiny.yaml", "--steps", "2", "--warmup", "1",
                     "--loader-batches", "40", f"data.path={data}", f"model.block_size={SEQ_LEN}",
                     "train.tokens_per_step=1024", "data.num_workers=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"training step: [\d,]+ tokens/s", result.stdout)
    assert re.search(r"data loader alone: [\d,]+ tokens/s per rank", result.stdout)
    ratio = float(re.search(r"loader / step: ([\d,.]+)x", result.stdout).group(1).replace(",", ""))
    assert ratio >= 10, result.stdout
