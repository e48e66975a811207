"""benchmarks/data_prep_throughput.py runs end to end (a smoke test on a tiny corpus)."""

from conftest import run_cli


def test_benchmark_prints_the_ratio():
    result = run_cli(
        "benchmarks/data_prep_throughput.py", "--megabytes", "1", "--repeats", "1", "--workers", "2"
    )
    assert result.returncode == 0, result.stderr
    assert "ratio owt_to_mds / best baseline" in result.stdout and "per core" in result.stdout
