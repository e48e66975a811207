"""order.kind=planner and order.weighting=bell in the real trainer: a run says what it trains and
logs what the planner's passes cost, a stopped and resumed run draws the same orders (the same
losses, bit for bit; planning with the EMA's weights too), and two processes, each planning the
sequences of its own micro-batches, train the run one process trains."""

import json
import subprocess
import sys

import pytest
from trainer_testing import MAIN, REPO, SYNTHETIC_RUN, Launcher, losses

from aogpt.trainer.metrics import read_metrics

PLANNED = ["order.kind=planner", "order.p_planner=0.5", "order.refresh=4",
           "order.planner_givens=[0,8]", "order.weighting=bell", "eval.every=3",
           "checkpoint.every=3", "train.tokens_per_step=1024"]


def planned_args(data, out, *overrides: str, ds_config="ds_configs/cpu.json") -> list[str]:
    return ["--ds_config", str(ds_config), "--config", "configs/tiny.yaml",
            f"data.path={data}", f"out_dir={out}", *SYNTHETIC_RUN, *PLANNED, *overrides]


def train_one_process(data, out, *overrides: str, ds_config="ds_configs/cpu.json") -> str:
    result = subprocess.run([sys.executable, MAIN,
                             *planned_args(data, out, *overrides, ds_config=ds_config)],
                            cwd=REPO, capture_output=True, text=True, timeout=600,
                            env=Launcher.environment())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def straight(synthetic_data, tmp_path_factory):
    """6 steps in one process, uninterrupted."""
    out = tmp_path_factory.mktemp("planned") / "straight"
    return out, train_one_process(synthetic_data, out, "train.max_steps=6")


@pytest.mark.slow
def test_a_planned_run_says_its_orders_and_logs_what_planning_costs(straight):
    out, output = straight
    assert ("orders: planner margin (p_planner 0.5, refresh 4, 0-8 given first), "
            "bell-weighted (width 0.25)") in output
    assert "planner " in output and " s/step" in output
    for record in read_metrics(out / "metrics.jsonl"):
        if "loss" in record:
            assert record["planner_s"] > 0 and 0 < record["planned_share"] < 1
            assert 64 < record["planner_rows"] < 64 * 65 / 2  # refresh 4: a fraction of n^2/2
            assert record["loss_l2r"] is None  # planned and random orders are any order


@pytest.mark.slow
def test_a_stopped_and_resumed_planned_run_is_the_uninterrupted_one(straight, synthetic_data,
                                                                    tmp_path):
    out_straight, _ = straight
    out = tmp_path / "resumed"
    train_one_process(synthetic_data, out, "train.max_steps=3")
    output = train_one_process(synthetic_data, out, "train.max_steps=6")
    assert "resumed from" in output
    # the orders of steps 4-6 come from the weights the checkpoint restored: the same bits
    for key in ("loss", "grad_norm", "val_loss_ao"):
        assert losses(out, key) == losses(out_straight, key), key


@pytest.mark.slow
def test_two_processes_each_planning_their_own_sequences_train_the_one_process_run(
        straight, synthetic_data, launcher, tmp_path):
    out_straight, _ = straight
    out = tmp_path / "two"
    result = launcher.run("deepspeed", planned_args(synthetic_data, out, "train.max_steps=3"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 2" in result.stdout
    # the same samples, orders and weights; the gradients summed over ranks in another order
    for key in ("loss", "grad_norm"):
        expected = {s: v for s, v in losses(out_straight, key).items() if s <= 3}
        assert losses(out, key) == pytest.approx(expected, abs=1e-5), key
    shares = [r["planned_share"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
    assert shares and all(0 < share < 1 for share in shares)  # rank 0 planned its own share


EMA_PLANNED = ["order.planner_weights=ema"]


@pytest.fixture(scope="module")
def ema_straight(synthetic_data, tmp_path_factory):
    """6 steps in one process, planning with the EMA's weights, uninterrupted."""
    out = tmp_path_factory.mktemp("planned_ema") / "straight"
    return out, train_one_process(synthetic_data, out, "train.max_steps=6", *EMA_PLANNED)


@pytest.mark.slow
def test_planning_with_the_ema_weights_resumes_bit_for_bit_and_plans_other_orders(
        straight, ema_straight, synthetic_data, tmp_path):
    """order.planner_weights=ema: the planner scores with the EMA's weights (restored by the
    checkpoint, so a resumed run plans as the uninterrupted one), which are not the trained
    network's: other orders, other losses than planning with the current weights."""
    (out_current, _), (out_ema, output) = straight, ema_straight
    assert "0-8 given first, EMA weights)" in output
    train_one_process(synthetic_data, tmp_path / "resumed", "train.max_steps=3", *EMA_PLANNED)
    output = train_one_process(synthetic_data, tmp_path / "resumed", "train.max_steps=6",
                               *EMA_PLANNED)
    assert "resumed from" in output
    for key in ("loss", "grad_norm", "val_loss_ao"):
        assert losses(tmp_path / "resumed", key) == losses(out_ema, key), key
    after_first = lambda out: {s: v for s, v in losses(out, "loss").items() if s > 1}  # noqa: E731
    assert after_first(out_ema) != after_first(out_current)  # the EMA leaves the weights at 1


@pytest.mark.slow
def test_planning_with_the_ema_weights_runs_under_zero3(ema_straight, synthetic_data, tmp_path):
    """ZeRO-3 partitions the trained weights, so the current ones cannot plan (refused); the
    EMA's copy is whole on every rank: the run plans, and trains what ZeRO-1 trains."""
    out_ema, _ = ema_straight
    config = tmp_path / "zero3_fp32.json"
    base = json.loads((REPO / "ds_configs" / "cpu.json").read_text())
    config.write_text(json.dumps({**base, "zero_optimization": {"stage": 3}}))
    out = tmp_path / "zero3"
    train_one_process(synthetic_data, out, "train.max_steps=3", *EMA_PLANNED, ds_config=config)
    shares = [r["planned_share"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
    assert shares and all(0 < share < 1 for share in shares)
    expected = {s: v for s, v in losses(out_ema, "loss").items() if s <= 3}
    assert losses(out, "loss") == pytest.approx(expected, abs=1e-5)
