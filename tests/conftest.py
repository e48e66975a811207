"""Shared fixtures: the repository root, the real text of ../shared/data when present, the data
and launcher of the trainer's runs, and a real S3 server with that data in a bucket."""

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from aogpt.data_prep.packing import available_cores
from aogpt.model import AOGPT, ModelConfig

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip, saying why, where there is no CUDA GPU (`pytest -m gpu` on a GPU
    machine runs them: benchmarks/gpu_report.py does)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def shared_text() -> Path:
    """WikiText-2 validation text from ../shared/data; the test is skipped where it is absent."""
    path = SHARED_DATA / "wikitext-2" / "valid.txt"
    if not path.is_file():
        pytest.skip(f"real text not available here ({path} is absent: a fresh clone elsewhere)")
    return path


def pytest_configure(config):
    """Under pytest-xdist (make test runs one worker per core), each worker and the processes
    its tests start get their share of the cores: torch's default of every core per process
    made compute-bound tests 4x slower with two workers on two cores."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, available_cores() // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def built_once(tmp_path_factory, name: str, build) -> tuple[Path, str]:
    """A folder named `name` and what build(folder) returned (a string), built once per test
    run: under pytest-xdist the first worker to ask builds it while the others wait, then all
    read it. A build that failed (its assertion fails that test) is started afresh by the next
    test that asks."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this run
    folder, result = root / name, root / f"{name}.result"
    with FileLock(str(root / f"{name}.lock")):
        if not result.is_file():
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir()
            result.write_text(build(folder))
    return folder, result.read_text()


@pytest.fixture(scope="session")
def text_data(tmp_path_factory) -> Path:
    """Real text (trainer_testing.real_documents) made into MDS shards by data_prep/owt_to_mds.py,
    once per test run: every test reads it, none writes into it (a test that damages shards, or
    needs a folder of its own, copies it first)."""
    from trainer_testing import build_data, real_documents  # tests/trainer/, whose modules ask

    folder, _ = built_once(tmp_path_factory, "data",
                           lambda folder: str(build_data(folder / "text", real_documents())))
    return folder / "text"


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory) -> Path:
    """The synthetic language's shards (data_prep/synthetic_to_mds.py: 128 token ids, sequences
    of 64, as many as text_data has), once per test run: the data of the whole-run tests, whose
    assertions are about how a run runs (resumes, signals, rollbacks, ZeRO stages, waits) and not
    about text. Its model (trainer_testing.SYNTHETIC_RUN) has a head of 128 rows instead of
    GPT-2's 50,257, which were ~85% of each step's arithmetic: the reference's 18 steps in one
    process took 6.4 s instead of 41 s."""
    from trainer_testing import build_synthetic  # tests/trainer/, whose modules ask

    folder, _ = built_once(tmp_path_factory, "synthetic",
                           lambda folder: str(build_synthetic(folder / "language")))
    return folder / "language"


@pytest.fixture(scope="session")
def finished_run(synthetic_data, tmp_path_factory) -> tuple[Path, str]:
    """One finished training (trainer_testing.train_logged: one process, 6 steps of the tiny
    model on synthetic_data, a validation and a checkpoint every 3) for the tests that read a run
    folder or its log: (out_dir, the log's text), once per test run. None writes into it; a test
    that needs to copies it."""
    from trainer_testing import train_logged  # tests/trainer/, whose modules ask

    folder, log = built_once(tmp_path_factory, "runs", lambda folder: train_logged(
        synthetic_data, folder / "finished", "train.max_steps=6"))
    return folder / "finished", log


@pytest.fixture(scope="session")
def reference_run(synthetic_data, tmp_path_factory) -> tuple[Path, str, int]:
    """The uninterrupted 2-process run that whole-run tests compare with (trainer_testing.
    train_reference: 18 steps of synthetic_data under the deepspeed launcher, ZeRO-1 fp32), once
    per test run: (out_dir, its output, its launch's port). None writes into it."""
    from trainer_testing import train_reference  # tests/trainer/, whose modules ask

    folder, result = built_once(tmp_path_factory, "reference",
                                lambda folder: train_reference(synthetic_data, folder / "run"))
    launch = json.loads(result)
    return folder / "run", launch["output"], launch["port"]


@pytest.fixture(scope="session")
def s3_server():
    """One S3 server (tests/s3_testing.py) for the whole session, reached through the
    environment that every command under test inherits (S3_ENDPOINT_URL, credentials)."""
    from s3_testing import S3Server

    server = S3Server()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in server.env.items():
            patch.setenv(name, value)
        yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_text_data(s3_server, tmp_path_factory) -> str:
    """text_data's dataset built by owt_to_mds.py straight into a bucket (the same documents and
    settings, so the same bytes as text_data's folder): its s3:// URL."""
    from trainer_testing import build_data, real_documents  # tests/trainer/, whose modules ask

    url = f"{s3_server.bucket('aogpt-text')}/text"
    staging = tmp_path_factory.mktemp("s3_staging")
    build_data(url, real_documents(), source_dir=staging, extra=["--staging", str(staging / "s")])
    return url


@pytest.fixture(scope="session")
def s3_synthetic_data(s3_server, synthetic_data) -> str:
    """synthetic_data's folder uploaded to a bucket as a remote build leaves it (shards, then
    indexes, then manifest.json, which marks it complete): its s3:// URL."""
    url = f"{s3_server.bucket('aogpt-synthetic')}/language"
    files = sorted((path for path in synthetic_data.rglob("*") if path.is_file()),
                   key=lambda path: (path.name == "manifest.json", path.name == "index.json"))
    for path in files:
        s3_server.write(f"{url}/{path.relative_to(synthetic_data)}", path.read_bytes())
    return url


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium for the module's tests (Debian's, driven by Playwright: tools/browser.py
    launches it); they skip, saying why, where either is missing."""
    browsers = tool("browser")
    reason = browsers.missing()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = browsers.launch(playwright)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A page of `browser` in a context of its own (no cookies or storage from another test) that
    records every request it makes (page.requests)."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.requests = []
    page.on("request", lambda request: page.requests.append(request.url))
    page.set_default_timeout(20_000)
    yield page
    context.close()


@pytest.fixture(scope="module")
def launcher():
    """A module's trainer_testing.Launcher."""
    from trainer_testing import Launcher

    return Launcher()


# An output file that cannot be written, by case, with the words of its one-line refusal.
UNWRITABLE_FILES = {"a folder": "is a folder: name a file in it",
                    "below a file": "is a file, not a folder"}


def unwritable_file(folder: Path, case: str, name: str) -> Path:
    """`folder` itself, or `name` below a file made in it (a file the command must leave alone)."""
    (folder / "notes.txt").write_text("mine")
    return folder if case == "a folder" else folder / "notes.txt" / name


@functools.cache
def tool(name: str):
    """tools/<name>.py as a module (tools/ is no package), loaded once per process. Modules that
    import heavy libraries (export_hf.py: transformers) are asked for inside tests, not at
    collection, which every pytest-xdist worker pays."""
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would: a dataclass's module is looked up there
    spec.loader.exec_module(module)
    return module


def run_cli(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Runs a command of this repo with the test's interpreter and captures its output."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env)


# What a launcher sets for its processes. A test that leaves them set in its worker (a command's
# main run in-process, filling in a world of one) makes every launch a later test starts from that
# worker inherit them: a 2-process deepspeed run then reads LOCAL_WORLD_SIZE=1, its data loader
# counts two nodes of one rank, and both ranks create the same shared-memory block.
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                    "MASTER_PORT")


@pytest.fixture(autouse=True)
def launch_variables_left_as_found():
    before = {name: os.environ.get(name) for name in LAUNCH_VARIABLES}
    yield
    after = {name: os.environ.get(name) for name in LAUNCH_VARIABLES}
    for name, value in before.items():  # put back first, so that one leak fails one test only
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    changed = {name: after[name] for name in LAUNCH_VARIABLES if after[name] != before[name]}
    assert not changed, f"the test left launcher variables set in its process: {changed}"


@pytest.fixture
def run_main(capsys):
    """run_main(main, *argv) -> (exit status, stdout, stderr): a command's cli_entry main in this
    process, for tests of what it computes and of its variants of bad input (a subprocess pays the
    imports, seconds each on 2 cores); what a real process does (its status, signals) stays with
    run_cli, and so does one refusal per command, its one line as a user sees it. The environment
    the command sets (the rank variables of a world of one) is undone after."""
    saved = dict(os.environ)

    def run(main, *argv) -> tuple[int, str, str]:
        code = main([str(arg) for arg in argv])
        out, err = capsys.readouterr()
        return code, out, err

    yield run
    os.environ.clear()
    os.environ.update(saved)


def perturbed_float64_model(config: ModelConfig, seed: int = 0) -> AOGPT:
    """A float64 model in eval mode whose norms, biases and AdaLN are moved away from their init
    values (ones, zeros, near zero), so tests of exact equalities exercise them."""
    torch.manual_seed(seed)
    model = AOGPT(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
            if "adaLN" in name:
                p.mul_(10)
    return model


def assert_cache_holds_the_full_forward(network: AOGPT, out, sampler) -> None:
    """After a generation, the sampler's cache holds, slot by slot, the keys and values of one
    full forward of the generated tokens along the order they took (out: its Generation)."""
    keys, values = [], []

    class Recording:
        def update(self, layer, k, v):
            keys.append(k)
            values.append(v)
            return k, v

    inputs, positions, targets, _ = network.training_stream(out.tokens, out.orders)
    network.forward_stream(inputs, positions, targets, cache=Recording())
    kv = sampler.cache.kv[:, :, :, :, :out.tokens.size(1)]  # (layers, 2, b, h, slots, hd)
    for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
        torch.testing.assert_close(kv[layer, 0], k, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(kv[layer, 1], v, rtol=1e-10, atol=1e-10)
