"""What the sbatch templates would run on a multi-node job, from fake SLURM_* variables.

AOGPT_DRY_RUN=1 makes a template print its plan and command and start nothing; node lists are
expanded by the real `scontrol show hostnames` (it needs only a config file, no controller).
"""

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def job_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a batch shell on a GPU cluster, for a dry run submitted from the repo."""
    if shutil.which("scontrol") is None:
        pytest.skip("SLURM's scontrol is not installed (.ci/run installs it)")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=dry\nSlurmctldHost=localhost\n")
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
            "SLURM_CONF": str(conf), "AOGPT_DRY_RUN": "1", "AOGPT_PYTHON": sys.executable,
            "SLURM_SUBMIT_DIR": str(REPO), "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "aogpt-small",
            "SLURM_JOB_NODELIST": "gpu[007-008]", "SLURM_CPUS_ON_NODE": "96"}


def run_template(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / script)], capture_output=True, text=True, env=env,
                          cwd="/", timeout=60)


def planned_command(script: str, env: dict[str, str]) -> tuple[str, list[str]]:
    """(the printed plan, the command as argv) of a dry run that must succeed."""
    result = run_template(script, env)
    assert result.returncode == 0, result.stderr
    commands = [line.split("command:", 1)[1] for line in result.stdout.splitlines()
                if "command:" in line]
    assert len(commands) == 1, result.stdout
    return result.stdout, shlex.split(commands[0])


def option(argv: list[str], name: str) -> str:
    values = [arg.split("=", 1)[1] for arg in argv if arg.startswith(name + "=")]
    assert len(values) == 1, f"{name} given {len(values)} times in {argv}"
    return values[0]


def torchrun_and_trainer(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Splits `srun ... python -m torch.distributed.run ... trainer/main.py ...` in three."""
    run = argv.index("torch.distributed.run")
    main = argv.index("trainer/main.py")
    return argv[:run - 2], argv[run + 1:main], argv[main + 1:]


@pytest.mark.parametrize("nodelist, hosts", [
    ("gpu[007-008]", ["gpu007", "gpu008"]),
    ("gpu[001-002,010],big-a1", ["gpu001", "gpu002", "gpu010", "big-a1"]),
])
def test_one_torchrun_per_node_with_the_rendezvous_on_the_first_node(job_env, nodelist, hosts):
    job_env["SLURM_JOB_NODELIST"] = nodelist
    plan, argv = planned_command("slurm/train_small.sh", job_env)
    srun, torchrun, _ = torchrun_and_trainer(argv)
    nodes = len(hosts)
    assert srun[0] == "srun"
    assert option(srun, "--nodes") == str(nodes)
    assert option(srun, "--ntasks-per-node") == "1"
    assert option(srun, "--cpus-per-task") == "96"
    assert option(torchrun, "--nnodes") == str(nodes)
    assert option(torchrun, "--nproc-per-node") == "8"
    assert option(torchrun, "--rdzv-backend") == "c10d"
    assert option(torchrun, "--rdzv-endpoint") == f"{hosts[0]}:{20000 + 4242}"
    assert option(torchrun, "--rdzv-id") == "aogpt-4242"
    assert "SIGUSR1" in option(torchrun, "--signals-to-handle").split(",")
    assert f"nodes ({nodes}): {' '.join(hosts)}" in plan
    assert f"{nodes} node(s) x 8 process(es) = {nodes * 8} ranks" in plan
    assert "OMP_NUM_THREADS=12 " in plan  # 96 CPUs / 8 processes


def test_trainer_gets_the_preset_ds_config_and_settings_as_overrides(job_env):
    job_env.update(AOGPT_DATA="/scratch/owt", AOGPT_OUT_DIR="/scratch/runs/a",
                   AOGPT_OVERRIDES="train.max_steps=100 order.p_left_to_right=0.5")
    _, argv = planned_command("slurm/train_small.sh", job_env)
    _, _, trainer = torchrun_and_trainer(argv)
    assert trainer == ["--ds_config", "ds_configs/zero2.json", "--config",
                       "configs/ao_gpt_small.yaml", "data.path=/scratch/owt",
                       "out_dir=/scratch/runs/a", "train.max_steps=100",
                       "order.p_left_to_right=0.5"]


def test_one_folder_names_the_five_zero_shot_sets(job_env):
    job_env.update(AOGPT_EVAL_DIR="/scratch/eval")
    _, argv = planned_command("slurm/train_small.sh", job_env)
    _, _, trainer = torchrun_and_trainer(argv)
    assert trainer[-1] == ("eval.sets=[/scratch/eval/wikitext2,/scratch/eval/wikitext103,"
                           "/scratch/eval/ptb,/scratch/eval/lambada,/scratch/eval/lm1b]")


def test_medium_template_trains_the_medium_preset(job_env):
    _, argv = planned_command("slurm/train_medium.sh", job_env)
    _, _, trainer = torchrun_and_trainer(argv)
    assert trainer[trainer.index("--config") + 1] == "configs/ao_gpt_medium.yaml"


def sbatch_lines(script: str) -> list[str]:
    return [line.split(None, 1)[1] for line in (REPO / script).read_text().splitlines()
            if line.startswith("#SBATCH")]


@pytest.mark.parametrize("script, nodes", [("slurm/train_small.sh", 2),
                                           ("slurm/train_medium.sh", 4)])
def test_train_templates_ask_for_gpus_a_warning_and_requeue(script, nodes):
    lines = sbatch_lines(script)
    for expected in (f"--nodes={nodes}", "--gpus-per-node=8", "--ntasks-per-node=1",
                     "--signal=B:USR1@300", "--requeue", "--open-mode=append",
                     "--output=logs/%x-%j.out"):
        assert expected in lines


@pytest.mark.parametrize("gpu_env", [{"SLURM_GPUS_PER_NODE": "h100:4"},  # --gpus-per-node=h100:4
                                     {"SLURM_GPUS_ON_NODE": "4"},  # --gres=gpu:4
                                     {"AOGPT_GPUS_PER_NODE": "4"}])
def test_one_process_per_gpu_of_the_job(job_env, gpu_env):
    job_env.update(gpu_env)
    plan, argv = planned_command("slurm/train_small.sh", job_env)
    assert option(torchrun_and_trainer(argv)[1], "--nproc-per-node") == "4"
    assert "4 GPUs per node" in plan


def test_cpu_only_job_runs_cpu_processes_with_the_cpu_ds_config(job_env):
    job_env.update(SLURM_GPUS_PER_NODE="0", AOGPT_PROCS_PER_NODE="2")  # sbatch --gpus-per-node=0
    plan, argv = planned_command("slurm/train_small.sh", job_env)
    srun, torchrun, trainer = torchrun_and_trainer(argv)
    assert option(torchrun, "--nproc-per-node") == "2"
    assert not any(arg.startswith("--gpus") for arg in srun)
    assert trainer[:2] == ["--ds_config", "ds_configs/cpu.json"]
    assert "CPU-only" in plan


def test_rendezvous_uses_the_batch_hosts_own_name_on_the_first_node(job_env):
    # SLURM node names need not resolve; the machine the batch shell runs on knows its name.
    job_env["SLURMD_NODENAME"] = "gpu007"
    _, argv = planned_command("slurm/train_small.sh", job_env)
    _, torchrun, _ = torchrun_and_trainer(argv)
    assert option(torchrun, "--rdzv-endpoint") == f"{socket.gethostname()}:24242"
    job_env["AOGPT_MASTER_ADDR"] = "10.0.0.7"
    _, argv = planned_command("slurm/train_small.sh", job_env)
    assert option(torchrun_and_trainer(argv)[1], "--rdzv-endpoint") == "10.0.0.7:24242"


@pytest.mark.parametrize("setting, message", [
    ({"AOGPT_CONFIG": "configs/nope.yaml"}, "AOGPT_CONFIG=configs/nope.yaml does not exist"),
    ({"AOGPT_DS_CONFIG": "ds/x.json"}, "AOGPT_DS_CONFIG=ds/x.json does not exist"),
    ({"AOGPT_GPUS_PER_NODE": "many"}, "AOGPT_GPUS_PER_NODE=many"),
    ({"AOGPT_REPO": "/"}, "/ is not the aogpt checkout"),
    ({"AOGPT_DRY_RUN": "0", "SLURM_JOB_ID": ""}, "not inside a SLURM job"),
])
def test_bad_settings_stop_the_job_with_one_line(job_env, setting, message):
    job_env.update(setting)
    result = run_template("slurm/train_small.sh", job_env)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_data_prep_template_uses_the_jobs_cpus_as_workers(job_env):
    job_env.update(AOGPT_DATA="data/owt", AOGPT_DATA_SOURCE="/d/a.tar /d/b.tar",
                   SLURM_CPUS_PER_TASK="16", AOGPT_DATA_ARGS="--overwrite")
    _, argv = planned_command("slurm/data_prep.sh", job_env)
    assert argv[1:] == ["data_prep/owt_to_mds.py", "--out", "data/owt", "--workers", "16",
                        "--seq-len", "1024", "--source", "/d/a.tar", "/d/b.tar", "--overwrite"]


def test_data_prep_template_needs_an_output_folder(job_env):
    result = run_template("slurm/data_prep.sh", job_env)
    assert result.returncode == 2 and "AOGPT_DATA is not set" in result.stderr


def test_eval_template_scores_every_folder_in_one_run_per_gpu(job_env, tmp_path):
    for name in ("run", "wikitext2", "ptb"):
        (tmp_path / name).mkdir()
    job_env.update(AOGPT_CKPT=str(tmp_path / "run"), SLURM_GPUS_ON_NODE="4",
                   AOGPT_EVAL_DATA=f"{tmp_path / 'wikitext2'} {tmp_path / 'ptb'}",
                   AOGPT_EVAL_ARGS="--orders l2r,random --num-orders 4")
    _, argv = planned_command("slurm/eval.sh", job_env)
    main = argv.index("trainer/evaluate.py")
    assert option(argv[:main], "--nproc-per-node") == "4"
    assert "--standalone" in argv[:main]
    assert argv[main + 1:] == [
        "--ckpt", str(tmp_path / "run"), "--data", str(tmp_path / "wikitext2"),
        "--data", str(tmp_path / "ptb"), "--json", "logs/eval-4242.json",
        "--orders", "l2r,random", "--num-orders", "4"]


def test_eval_template_samples_on_the_same_processes_after_evaluating(job_env, tmp_path):
    """AOGPT_SAMPLE_ARGS: trainer/sample.py under the same torchrun (each process draws its share
    of the batches), after the evaluation, or alone without eval data."""
    for name in ("run", "wikitext2"):
        (tmp_path / name).mkdir()
    sampling = "--num-samples 64 --order l2r --sampler speculative --out logs/s.jsonl"
    job_env.update(AOGPT_CKPT=str(tmp_path / "run"), SLURM_GPUS_ON_NODE="4",
                   AOGPT_SAMPLE_ARGS=sampling)
    _, argv = planned_command("slurm/eval.sh", job_env)
    main = argv.index("trainer/sample.py")
    assert option(argv[:main], "--nproc-per-node") == "4" and "--standalone" in argv[:main]
    assert argv[main + 1:] == ["--ckpt", str(tmp_path / "run"), *sampling.split()]
    job_env["AOGPT_EVAL_DATA"] = str(tmp_path / "wikitext2")
    result = run_template("slurm/eval.sh", job_env)
    commands = [line.split("command:", 1)[1] for line in result.stdout.splitlines()
                if "command:" in line]
    assert [next(a for a in shlex.split(c) if a.startswith("trainer/")) for c in commands] == [
        "trainer/evaluate.py", "trainer/sample.py"]


def test_eval_template_needs_a_checkpoint_and_data(job_env):
    result = run_template("slurm/eval.sh", job_env)
    assert result.returncode == 2 and "AOGPT_CKPT is not set" in result.stderr
    assert re.fullmatch(r"error: [^\n]+\n", result.stderr)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_slurm_scripts_pass_shellcheck():
    scripts = sorted(str(p) for p in (REPO / "slurm").rglob("*.sh")) + [str(REPO / ".ci" / "run")]
    result = subprocess.run(["shellcheck", "-x", "-P", str(REPO / "slurm" / "lib"), *scripts],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout
