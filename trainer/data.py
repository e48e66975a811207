"""Training and validation batches from MDS shards through MosaicML Streaming.

    check_data(cfg, dist_env)            the manifests, present and made for this model
                                         (pre-flight), by data location
    TrainBatches(cfg, manifests, dist_env, device)
                                         endless (micro, seq_len) int64 batches with their samples'
                                         dataset indices, epoch after epoch; state_dict()/
                                         load_state_dict() for exact resumption (and to go back to
                                         an earlier position, a rollback), skip() past batches
    validation_loader(cfg, manifests, dist_env, device)
                                         the `val` split, unshuffled, never the training stream

A data location is a folder made by a data_prep tool (owt_to_mds.py for text) or a remote URL
(s3://, gs://, ...) of one. Remote shards are copied to a cache on each node, data.local_cache
(default out_dir/data_cache); with data.local_cache set, a local folder is treated the same way,
which keeps a shared filesystem out of the read path (many ranks reading small random pieces of
the same files is what shared filesystems do worst). Several datasets are mixed through
data.streams with their proportions.

A shard the loader cannot read ends the run with one line naming the file and the sample
(loader_failure: aogpt.RunFailure, exit status 1); a local shard whose file is missing or of
another size than its index records is refused before the run starts (check_shard_sizes).
Loader workers outlive SIGTERM and Ctrl-C so that a step can finish and save; close() ends them.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import tempfile
from pathlib import Path

import numpy as np
import torch

from aogpt import RunFailure, UsageError
from aogpt.data_prep import mds, remote
from aogpt.data_prep.manifest import (
    COLUMN,
    check_compatible,
    read_manifest,
    rebuild_command,
    split_path,
)
from aogpt.data_prep.streaming_compat import release_shared_memory, streaming
from aogpt.files import write_text_atomic
from aogpt.run_folder import RunFolder
from aogpt.trainer.config import RunConfig
from aogpt.trainer.dist_env import DistEnv
from aogpt.trainer.failsafe import PreemptionFlag, silence_in_child

is_remote = remote.is_remote


def training_locations(cfg: RunConfig) -> list[tuple[str, float | None]]:
    """(location, proportion) of every dataset mixed into training; proportions sum to 1 or are
    None."""
    if not cfg.data.streams:
        return [(cfg.data.path, None)]
    given = [s.proportion for s in cfg.data.streams if s.proportion is not None]
    if any(p <= 0 for p in given) or sum(given) > 1 + 1e-9:
        raise UsageError(f"data.streams proportions {given} must be positive and sum to at most 1")
    unset = len(cfg.data.streams) - len(given)
    if unset == 0 and abs(sum(given) - 1) > 1e-6:
        raise UsageError(f"data.streams proportions sum to {sum(given)}: make them sum to 1, or "
                         "leave one unset to take what is left")
    rest = (1.0 - sum(given)) / unset if unset else 0.0
    if unset and rest <= 0:
        raise UsageError("data.streams proportions already sum to 1: the streams without one "
                         "would get nothing")
    return [(s.path, s.proportion if s.proportion is not None else rest) for s in cfg.data.streams]


def validation_location(cfg: RunConfig) -> str:
    return cfg.data.path or cfg.data.streams[0].path


def cache_dir(cfg: RunConfig, location: str, manifest: dict, dist_env: DistEnv) -> Path:
    """Where a remote dataset is cached on this node (streaming wants one local dir per node).
    The folder's name keys on the location and on the indexes the manifest records, so a dataset
    rebuilt at the same URL is never read from the old one's cached shards."""
    root = Path(cfg.data.local_cache or RunFolder(cfg.out_dir).data_cache)
    node = dist_env.rank // dist_env.local_world_size
    identity = [location, *(split.get("index_sha256") for split in manifest["splits"].values())]
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:12]
    return root / f"node{node}" / digest


def location_manifest(cfg: RunConfig, location: str, dist_env: DistEnv) -> dict:
    """The manifest of a data location. An s3:// one is read and checked through aogpt's S3
    client (no bucket, no credentials, no manifest: one line); other schemes' through
    streaming's downloader, into a temporary folder."""
    if not is_remote(location):
        return read_manifest(location)
    if remote.scheme(location) == "s3":
        return remote.remote_manifest(location, "data location")
    remote.check_url(location, "data location")
    with tempfile.TemporaryDirectory(prefix="aogpt-manifest-") as tmp:
        try:
            streaming.base.storage.CloudDownloader.direct_download(
                remote.join(location, "manifest.json"), str(Path(tmp) / "manifest.json"))
        except Exception as err:  # each cloud SDK raises its own types
            raise UsageError(f"cannot read {location}/manifest.json: {err}") from None
        return read_manifest(tmp)


def check_data(cfg: RunConfig, dist_env: DistEnv) -> dict[str, dict]:
    """Every manifest used, by location; UsageError if one is missing, made for another model, or
    too small to fill a micro-batch on every rank, or if a shard is missing or of another size
    than its index records (a local folder's, or an s3:// location's by listing the bucket)."""
    needed: dict[str, list[str]] = {}
    for location, _ in training_locations(cfg):
        needed.setdefault(location, []).append("train")
    if cfg.eval.every:
        needed.setdefault(validation_location(cfg), []).append("val")
    manifests = {}
    for location, splits in needed.items():
        manifest = location_manifest(cfg, location, dist_env)
        try:  # named: with data.streams, several locations (local and remote) are checked
            check_compatible(manifest, cfg.model.block_size, cfg.model.vocab_size)
        except UsageError as err:
            raise UsageError(f"{location}: {err}") from None
        for split in splits:
            if split not in manifest["splits"]:
                raise UsageError(f"{location} has no {split!r} split (it has "
                                 f"{', '.join(manifest['splits']) or 'none'}): "
                                 "build it with data_prep/owt_to_mds.py")
        check_shard_sizes(location, manifest, splits)
        manifests[location] = manifest
    per_step = cfg.train.micro_batch_size * dist_env.world_size
    train_samples = sum(manifests[loc]["splits"]["train"].get("samples", per_step)
                        for loc, _ in training_locations(cfg))
    if train_samples < per_step:
        raise UsageError(f"the training data holds {train_samples} samples, fewer than one "
                         f"micro-batch on every rank ({per_step}): use more data")
    if (cfg.eval.every
            and not manifests[validation_location(cfg)]["splits"]["val"].get("samples", 1)):
        raise UsageError(f"the val split of {validation_location(cfg)} is empty: rebuild with "
                         "--val-fraction > 0, or set eval.every=0")
    return manifests


def how_to_fix(manifests: dict[str, dict]) -> str:
    """What to do about a damaged shard of these data locations (their manifests by location):
    re-copy it, or rebuild with the tool each dataset was made with; verify.py checks them."""
    checked = [location for location in manifests
               if not is_remote(location) or remote.scheme(location) in remote.WRITE_SCHEMES]
    check = (f"; `python data_prep/verify.py {' '.join(checked)}` checks every shard"
             if checked else "")
    rebuild = " or ".join(rebuild_command(location, manifest)
                          for location, manifest in manifests.items())
    return f"re-copy the file, or rebuild the dataset with {rebuild}{check}"


def check_shard_sizes(location: str, manifest: dict, splits: list[str]) -> None:
    """UsageError naming the first shard of these splits that is missing or not of the size its
    index records (a truncated copy, a full disk, an interrupted upload): one stat per local
    shard, one listing of an s3:// location, before any heavy work. Damage that keeps the size
    is for data_prep/verify.py, which reads every byte (and for the loader's hash check of every
    shard it downloads). Other remote schemes are checked by streaming as it downloads."""
    if is_remote(location):
        if remote.scheme(location) != "s3":
            return
        problems = remote.shard_size_problems(location, manifest, "data location", splits)
    else:
        problems = []
        for split in splits:
            folder = split_path(location, split)
            try:
                entries = mds.read_index(folder)
            except (OSError, ValueError) as err:
                raise UsageError(f"{folder / 'index.json'} is unreadable ({err}): "
                                 f"{how_to_fix({location: manifest})}") from None
            problems += [problem for entry in entries
                         if (problem := mds.shard_problem(folder, entry, header=False,
                                                          hashes=False))]
    if problems:
        more = f" (and {len(problems) - 1} more damaged shards)" if len(problems) > 1 else ""
        raise UsageError(f"shard {problems[0].path} is {problems[0].what}{more}: "
                         f"{how_to_fix({location: manifest})}")


# streaming's own message when a sample's bytes are past the end of its shard file
SAMPLE_NOT_PRESENT = re.compile(r"Relative sample index (\d+) is not present in the (\S+) file")
# and when a shard it copied does not have the hash its index records (validate_hash)
CHECKSUM_FAILURE = re.compile(r"Checksum failure: (\S+)")


def loader_failure(err: Exception, dataset, which: str, manifests: dict[str, dict]
                   ) -> RunFailure:
    """A loader's exception as one line naming the shard file and the sample it could not read,
    found by checking the dataset's shard files (sizes, headers) or named by streaming's message;
    streaming's own words otherwise."""
    text = str(err).strip()
    last = text.splitlines()[-1].strip() if text else ""
    detail = last if "Original Traceback" in text else f"{type(err).__name__}: {last}"
    named = SAMPLE_NOT_PRESENT.search(text)
    streams = getattr(dataset, "streams", ())  # none: a LocalDataset (evaluation's)
    for stream in streams:  # a copy that failed in streaming's background thread (or this one)
        copying = CopiedStream.failure(stream)
        if copying:
            damaged = CHECKSUM_FAILURE.search(copying)
            if damaged:
                return _damaged_copy(Path(damaged.group(1)), dataset, which, manifests)
            return RunFailure(f"the {which} data loader cannot copy a shard from {stream.remote} "
                              f"({copying}): check that the store is reachable, then re-run to "
                              f"resume from the last checkpoint")
    for stream in streams:
        folder = Path(stream.local) / (stream.split or "")
        try:
            entries = mds.read_index(folder)
        except (OSError, ValueError):
            continue
        for entry in entries:
            problem = mds.shard_problem(folder, entry, hashes=False)
            if problem is None or (stream.remote and problem.what == "missing"):  # not cached yet
                continue
            sample = problem.first_unreadable_sample
            if named and named.group(2) == problem.path.name:
                sample = int(named.group(1))
            at = f"sample {sample:,} of " if sample is not None else ""
            return RunFailure(f"the {which} data loader cannot read {at}shard {problem.path}: "
                              f"{problem.what} ({detail}): {how_to_fix(manifests)}")
    if named:
        return RunFailure(f"the {which} data loader cannot read sample {named.group(1)} of shard "
                          f"{named.group(2)} ({detail}): {how_to_fix(manifests)}")
    return RunFailure(f"the {which} data loader failed: {detail}: {how_to_fix(manifests)}")


def _damaged_copy(path: Path, dataset, which: str, manifests: dict[str, dict]) -> RunFailure:
    """A copied shard whose hash is not its index's: named by its source (the bucket's object),
    and removed from the cache, where streaming would take it for a good copy on the next run."""
    source = str(path)
    for stream in dataset.streams:
        folder = Path(stream.local) / (stream.split or "")
        if stream.remote and path.parent == folder:
            source = remote.join(stream.remote, stream.split or "", path.name)
    path.unlink(missing_ok=True)
    return RunFailure(f"the {which} data loader copied shard {source}, and its "
                      f"{next(iter(mds.HASHES))} hash differs from the index's: its bytes are "
                      f"damaged at the source (the copy was removed from the cache): "
                      f"{how_to_fix(manifests)}")


def shut_down_workers(loader) -> None:
    """Ends a DataLoader's persistent worker processes now: asked to stop, then killed if they do
    not (they ignore SIGTERM, see _ignore_preemption_signals)."""
    workers = getattr(loader, "_iterator", None)  # where DataLoader keeps persistent workers
    if workers is None or not hasattr(workers, "_shutdown_workers"):
        return
    processes = list(getattr(workers, "_workers", []))
    workers._shutdown_workers()
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
    loader._iterator = None


class CopiedStream(streaming.Stream):
    """A stream copied shard by shard into a cache, which says why a copy failed.

    Streaming copies shards in a background thread (of a loader worker, or of the process), and
    when that thread fails the loader only raises "Background thread failed. Check other
    traceback.": the cause is printed to stderr, in another process. Here the cause is also left
    in the cache folder (FAILURE, one line), where loader_failure reads it. An s3:// stream is
    copied through aogpt's S3 client, whose waits on a store that does not answer are bounded
    (data_prep/remote.py: AOGPT_S3_TIMEOUT_S), not through streaming's (60 s per try, tries
    within tries)."""

    FAILURE = ".aogpt-copy-failure"

    def __init__(self, **kwargs):
        if remote.scheme(kwargs.get("remote") or "") == "s3":
            # the ranks of a node that wait for the one copying the index wait as long as it may
            kwargs.setdefault("download_timeout", remote.timeout_budget() + remote.ATTEMPT_S)
        super().__init__(**kwargs)

    def _download_file(self, from_basename: str, to_basename: str | None = None) -> str:
        if remote.scheme(self.remote or "") != "s3":
            return super()._download_file(from_basename, to_basename)
        local = Path(self.local, self.split or "", to_basename or from_basename)
        local.parent.mkdir(parents=True, exist_ok=True)
        remote.download_url(remote.join(self.remote, self.split or "", from_basename), local,
                            f"data {self.remote}")
        return str(local)

    def prepare_shard(self, shard) -> int:
        try:
            return super().prepare_shard(shard)
        except Exception as err:
            last = (str(err).strip().splitlines() or [""])[-1]
            write_text_atomic(Path(self.local) / self.FAILURE, f"{type(err).__name__}: {last}")
            raise

    @classmethod
    def failure(cls, stream) -> str | None:
        """The cause a stream left, if it is one of these and failed (read once)."""
        path = Path(stream.local) / cls.FAILURE
        if not isinstance(stream, cls) or not path.is_file():
            return None
        cause = path.read_text()
        path.unlink(missing_ok=True)
        return cause


def _stream(cfg: RunConfig, location: str, manifest: dict, split: str, dist_env: DistEnv,
            proportion: float | None = None):
    if is_remote(location) or cfg.data.local_cache:  # copied shard by shard into the cache
        relative = manifest["splits"][split]["path"]
        # Every copy is checked against the hash its index records, where the builder wrote one
        # (a shard damaged in the bucket is named, not trained on).
        validate_hash = next(iter(manifest.get("shard_hashes", [])), None)
        local = cache_dir(cfg, location, manifest, dist_env) / relative
        (local / CopiedStream.FAILURE).unlink(missing_ok=True)  # an earlier run's
        return CopiedStream(remote=remote.join(location, relative), local=str(local),
                            proportion=proportion, validate_hash=validate_hash)
    return streaming.Stream(local=str(split_path(location, split)), proportion=proportion)


SAMPLE_ID = "sample_id"  # added to each sample read: its index in the dataset


class IndexedStreamingDataset(streaming.StreamingDataset):
    """A StreamingDataset whose samples carry their index in the dataset (SAMPLE_ID).

    The index names a sample whatever the number of nodes, ranks and workers that read it, so
    keying each sample's generation order on it keeps training the same run when it resumes on
    another world size (streaming deals the same samples to every optimizer step, in another
    arrangement over ranks and micro-batches)."""

    def get_item(self, sample_id: int, retry: int = 7) -> dict:
        return {**super().get_item(sample_id, retry), SAMPLE_ID: sample_id}

    # Streaming 0.13 copies shards in two background threads. When one fails (a store that went
    # away, a damaged shard), the sample loop stops as if the epoch had ended (the loader would
    # start the next one), and the thread never counts itself out, so the next epoch waits for
    # it forever: a hang instead of an error. Here a failed thread counts itself out, and the
    # sample loop raises (CopiedStream has left the cause where loader_failure reads it).

    def _prepare_thread(self, it) -> None:
        self._counted_out(super()._prepare_thread, it)

    def _ready_thread(self, it) -> None:
        self._counted_out(super()._ready_thread, it)

    @staticmethod
    def _counted_out(thread, it) -> None:
        try:
            thread(it)
        except Exception:
            it.on_exit()
            raise

    def _each_sample_id(self, it):
        yield from super()._each_sample_id(it)
        if self._event.is_set():
            raise RuntimeError("copying a shard failed in streaming's background thread")


def collate_tokens(samples: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """MDS samples (uint16 arrays) -> a (b, seq_len) int64 batch and the (b,) sample indices."""
    tokens = torch.from_numpy(np.stack([s[COLUMN] for s in samples]).astype(np.int64))
    return tokens, torch.tensor([s[SAMPLE_ID] for s in samples], dtype=torch.int64)


def _ignore_preemption_signals(worker_id: int) -> None:
    # Launchers signal the whole process tree, and Ctrl-C reaches every process of the terminal's
    # group. Loader workers must outlive the signal, so the trainer can still finish its step and
    # checkpoint; it shuts them down itself afterwards.
    for sig in PreemptionFlag.SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    silence_in_child()


def _loader(dataset, cfg: RunConfig, num_workers: int, device: torch.device, drop_last: bool):
    return streaming.StreamingDataLoader(
        dataset, batch_size=cfg.train.micro_batch_size, collate_fn=collate_tokens,
        num_workers=num_workers, persistent_workers=num_workers > 0,
        pin_memory=device.type == "cuda", drop_last=drop_last,
        worker_init_fn=_ignore_preemption_signals if num_workers else None,
    )


class TrainBatches:
    """Endless training micro-batches. Re-iterating the dataset starts its next epoch, which
    streaming shuffles afresh (seeded by train.seed), so the stream simply runs on across epochs."""

    def __init__(self, cfg: RunConfig, manifests: dict[str, dict], dist_env: DistEnv,
                 device: torch.device):
        streams = [_stream(cfg, location, manifests[location], "train", dist_env, proportion)
                   for location, proportion in training_locations(cfg)]
        self.dataset = IndexedStreamingDataset(
            streams=streams, shuffle=True, shuffle_seed=cfg.train.seed,
            shuffle_algo=cfg.data.shuffle_algo, num_canonical_nodes=cfg.data.num_canonical_nodes,
            # streaming's resumption needs the per-rank batch
            batch_size=cfg.train.micro_batch_size,
        )
        # drop_last: every micro-batch is full, so every optimizer step sees exactly
        # tokens_per_step tokens; an epoch's few leftover samples are skipped, never repeated.
        self.loader = _loader(self.dataset, cfg, cfg.data.num_workers, device, drop_last=True)
        # what a loader failure names: each location's dataset and the tool that rebuilds it
        self.manifests = {location: manifests[location] for location, _ in training_locations(cfg)}
        self.device = device
        self._iterator = None

    def __iter__(self) -> TrainBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next micro-batch on the device: tokens (micro, t) and sample indices (micro,)."""
        empty_epochs = 0
        while True:
            if self._iterator is None:
                self._iterator = iter(self.loader)
            try:
                tokens, sample_ids = next(self._iterator)
                return (tokens.to(self.device, non_blocking=True),
                        sample_ids.to(self.device, non_blocking=True))
            except StopIteration:
                self._iterator = None
                empty_epochs += 1
                # One empty epoch is normal: a run resumed right at an epoch's end.
                if empty_epochs >= 2:
                    raise UsageError("the training split has fewer samples than one micro-batch "
                                     "per rank: use more data or a smaller micro batch") from None
            except Exception as err:  # a shard that cannot be read, a worker that died
                raise loader_failure(err, self.dataset, "training", self.manifests) from None

    def close(self) -> None:
        """Ends the worker processes and frees the shared memory (the run is over, or failing)."""
        shut_down_workers(self.loader)
        self._iterator = None
        release_shared_memory(self.dataset)

    def state_dict(self) -> dict:
        """The position after the last batch handed out: take it at optimizer-step boundaries."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """The next batch is the sample after `state`'s position: at the start of a run, or later
        to go back to it (a rollback, trainer/recovery.py; collective over a node's ranks, which
        share the dataset's shared memory: no rank may draw a batch before all have loaded)."""
        if self._iterator is not None:
            shut_down_workers(self.loader)
            self._iterator = None
        # Streaming ignores a position in an epoch before the one it believes comes next (it takes
        # it for a stale checkpoint): going back in the same process, that epoch comes next again
        self.dataset.next_epoch = state["epoch"]
        self.loader.load_state_dict(state)
        # Streaming keeps the position in a shared-memory block that one rank of a node creates
        # and the others attach to: no rank goes on before all have attached, or a rank with
        # nothing left to do (a run already at train.max_steps) exits and unlinks the block while
        # another still attaches to it (FileNotFoundError '/<prefix>_resume')
        if torch.distributed.is_initialized():
            torch.distributed.barrier()

    def skip(self, micro_batches: int) -> list[int]:
        """Moves the stream past this rank's next `micro_batches` micro-batches; their samples'
        dataset indices."""
        return [index for _ in range(micro_batches) for index in next(self)[1].tolist()]


class ValidationBatches:
    """The val split, unshuffled, the same samples in the same order at every evaluation."""

    def __init__(self, cfg: RunConfig, manifests: dict[str, dict], dist_env: DistEnv,
                 device: torch.device):
        location = validation_location(cfg)
        self.manifests = {location: manifests[location]}  # what a loader failure names
        self.dataset = IndexedStreamingDataset(
            streams=[_stream(cfg, location, manifests[location], "val", dist_env)],
            shuffle=False, batch_size=cfg.train.micro_batch_size,
        )
        self.loader = _loader(self.dataset, cfg, num_workers=0, device=device, drop_last=False)

    def __iter__(self):
        try:
            yield from self.loader
        except Exception as err:  # a shard that cannot be read
            raise loader_failure(err, self.dataset, "validation", self.manifests) from None

    def close(self) -> None:
        shut_down_workers(self.loader)
        release_shared_memory(self.dataset)


def validation_loader(cfg: RunConfig, manifests: dict[str, dict], dist_env: DistEnv,
                      device: torch.device) -> ValidationBatches:
    return ValidationBatches(cfg, manifests, dist_env, device)

