"""Data folders in object storage: a remote --out for the builders, and the checks of a remote
dataset that verify.py and the trainer make before any work.

A remote data folder is a URL whose objects are laid out like a local data folder:
PREFIX/manifest.json, PREFIX/train/index.json, PREFIX/train/shard.00000.mds, ... Streaming reads
every scheme it knows (s3, gs, oci, azure, azure-dl, hf, dbfs, sftp, alipan): the trainer passes
those URLs on to it. Writing, listing and checking go through an S3 client, so the builders and
verify.py take s3:// URLs: AWS, and every S3-compatible store through S3_ENDPOINT_URL (the variable
streaming's own S3 client reads: MinIO, Ceph, Cloudflare R2, and the S3-compatible endpoints of
GCS and OCI). The tests run them against a real S3 server on 127.0.0.1.

How a remote build stays complete or absent, with no rename in object storage:
- the dataset is built in a local staging folder exactly as a local build (build_dir.StagingDir:
  resumable, bad input leaves nothing), then uploaded;
- before the first upload, PREFIX/.aogpt-upload.json records the build's settings and every object
  the upload writes; the shards go first, then each index.json, then manifest.json, and the record
  is deleted last. manifest.json in the bucket therefore means "complete";
- a re-run with the same settings skips the objects already there with the size of the staged file
  (an object is written whole or not at all, and the build is deterministic); other settings or
  --overwrite delete the old dataset's objects first (the manifest first, so it never claims a
  dataset that is half gone). Only objects that the record or the manifest's indexes list are ever
  deleted: anything else under PREFIX is refused before any work, and nothing is deleted.

A store that does not answer is waited for within a budget (Patience): AOGPT_S3_TIMEOUT_S seconds
per request, retries included (default 60), in tries of at most 10 s each (the last may end up to
10 s after the budget), with a line every 30 s and then one line naming the endpoint and the
setting; a store that refuses connections is said at once. The trainer's and evaluate.py's
copies of shards come through the same client and waits (download_url, which trainer/data.py's
CopiedStream calls for s3://).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aogpt import UsageError
from aogpt.data_prep import mds
from aogpt.data_prep.build_dir import INDEX, OutputDir, StagingDir
from aogpt.data_prep.manifest import (
    FILENAME,
    FORMAT,
    builder_of,
    describe_builder,
    read_manifest,
)
from aogpt.progress import progress

# Streaming's download schemes (streaming.base.storage.download): the trainer reads these.
READ_SCHEMES = ("s3", "gs", "oci", "azure", "azure-dl", "hf", "dbfs", "sftp", "alipan")
WRITE_SCHEMES = ("s3",)
UPLOAD_RECORD = ".aogpt-upload.json"
UPLOAD_THREADS = 8  # objects in flight: uploads wait on the network, not the CPU


def is_remote(location: str | os.PathLike) -> bool:
    return "://" in str(location)


def scheme(url: str) -> str:
    return urllib.parse.urlparse(url).scheme


def check_url(url: str, what: str, writing: bool = False) -> None:
    """A URL of a scheme this command handles, with a bucket and a prefix: one line otherwise."""
    schemes = WRITE_SCHEMES if writing else READ_SCHEMES
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in schemes:
        known = ", ".join(f"{name}://" for name in schemes)
        also = ("; other stores: build into a local folder and copy it there, or use their "
                "S3-compatible endpoint through S3_ENDPOINT_URL") if writing else ""
        raise UsageError(f"{what} {url}: unknown scheme {parsed.scheme}:// (this command takes "
                         f"a local folder or {known}){also}")
    if not parsed.netloc:
        raise UsageError(f"{what} {url} names no bucket: write {parsed.scheme}://BUCKET/PREFIX")
    if parsed.scheme == "s3" and not parsed.path.strip("/"):
        raise UsageError(f"{what} {url} names no prefix: a dataset takes a folder of its own, "
                         f"e.g. {url.rstrip('/')}/owt")


def join(base: str, *parts: str) -> str:
    """Path parts joined with "/" onto a URL, a folder or "" (an object name relative to a
    prefix); the "." of an eval set's split adds nothing."""
    names = [base.rstrip("/")] if base else []
    return "/".join(names + [part.strip("/") for part in parts if part not in ("", ".")])


# How long object storage may leave a request unanswered, in all, before a command gives up
TIMEOUT_SETTING = "AOGPT_S3_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0
ATTEMPT_S = 10.0  # connect and read timeout of one attempt: a budget is spent in tries of this
SAY_EVERY_S = 30.0  # a line while a wait goes on


def timeout_budget() -> float:
    """AOGPT_S3_TIMEOUT_S: seconds (default 60) that one request may wait in all, retries
    included."""
    text = os.environ.get(TIMEOUT_SETTING, "")
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        seconds = float("nan")
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"{TIMEOUT_SETTING}={text!r}: give the seconds (> 0) a request to object "
                         f"storage may wait in all, e.g. {TIMEOUT_SETTING}=60")
    return seconds


CLIENT_SETTINGS = ("S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE")


def _client(attempt_s: float):
    """The process's S3 client, made as streaming makes its own: endpoint from S3_ENDPOINT_URL,
    credentials from boto3's usual chain. It tries once; Patience retries."""
    settings = tuple(os.environ.get(name) for name in CLIENT_SETTINGS)
    return _new_client(os.getpid(), attempt_s, settings)


@functools.lru_cache
def _new_client(pid: int, attempt_s: float, settings: tuple):
    """One per process (clients are thread-safe, not fork-safe) and per setting of the
    environment that a client reads when it is made."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", endpoint_url=settings[0],
        config=Config(connect_timeout=attempt_s, read_timeout=attempt_s,
                      retries={"mode": "standard", "total_max_attempts": 1}))


class Patience:
    """A request to object storage that is retried while it goes unanswered (a timeout, a
    dropped connection, a store that says it is busy), for AOGPT_S3_TIMEOUT_S in all: a line every
    30 s while it waits, then one line naming the endpoint and the setting. An endpoint that
    refuses connections is no wait: that is said at once."""

    def __init__(self, what: str):
        self.what, self.budget = what, timeout_budget()
        self.attempt_s = min(ATTEMPT_S, self.budget)
        self.client = _client(self.attempt_s)
        self.endpoint = self.client.meta.endpoint_url
        self._said_at = 0.0  # the waited time last said (shared by the threads of an upload)

    def run(self, request, refused_too: bool = False):
        """request() once it answers, retried as the class says (`refused_too`: a refused
        connection as well, the store restarting under a run); UsageError when it never does."""
        from botocore.exceptions import (
            ClientError,
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            IncompleteReadError,
            ReadTimeoutError,
            ResponseStreamingError,
        )

        waited, attempts = 0.0, 0
        while True:
            started = time.monotonic()
            try:
                return request()
            # a body cut short (IncompleteReadError, ResponseStreamingError) is a connection
            # dropped mid-answer: a store going away while a shard streams in
            except (ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError,
                    EndpointConnectionError, IncompleteReadError, ResponseStreamingError,
                    ClientError) as err:
                if ((isinstance(err, ClientError) and _error_code(err) not in BUSY)
                        or (type(err) is EndpointConnectionError and not refused_too)):
                    raise
                attempts += 1
                if time.monotonic() - started < 1:  # failed at once: a pause, not a spin
                    time.sleep(1.0)
                waited += time.monotonic() - started
                if waited >= self.budget:  # spent (the last try may end up to 10 s after it)
                    tries = f"{attempts} {'try' if attempts == 1 else 'tries'}"
                    raise UsageError(
                        f"{self.what}: the S3 endpoint {self.endpoint} did not answer in "
                        f"{waited:.0f} s ({tries}, the last: {type(err).__name__}; "
                        f"{TIMEOUT_SETTING}={self.budget:g}): check S3_ENDPOINT_URL and the "
                        f"network, or raise {TIMEOUT_SETTING} for a slow store") from None
                if waited - self._said_at >= SAY_EVERY_S:
                    self._said_at = waited
                    print(f"waiting for the S3 endpoint {self.endpoint}: no answer for "
                          f"{waited:.0f} s ({type(err).__name__}), trying again until "
                          f"{self.budget:g} s ({TIMEOUT_SETTING})", file=sys.stderr, flush=True)


# what a store answers when it is busy or briefly failing: tried again, as a timeout is
BUSY = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable",
        "InternalError", "500", "502", "503", "504"}


def _error_code(err) -> str:
    return str(err.response.get("Error", {}).get("Code"))


def _get_to_file(client, bucket: str, key: str, local: Path) -> None:
    """An object written to `local` whole or not at all (a partial download is never left there
    under the shard's name)."""
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    partial = local.with_name(f".{local.name}.download")
    try:
        with open(partial, "wb") as file:
            shutil.copyfileobj(body, file, 1 << 20)
        os.replace(partial, local)
    finally:
        partial.unlink(missing_ok=True)


def download_url(url: str, local: str | Path, what: str) -> None:
    """s3://BUCKET/KEY -> local, with the bounded waits of Patience; FileNotFoundError when there
    is no such object (as streaming's downloaders raise)."""
    from botocore.exceptions import ClientError

    parsed = urllib.parse.urlparse(url)
    patience = Patience(what)
    try:
        patience.run(lambda: _get_to_file(patience.client, parsed.netloc, parsed.path.lstrip("/"),
                                          Path(local)), refused_too=True)
    except ClientError as err:
        if _error_code(err) in ("404", "NoSuchKey"):
            raise FileNotFoundError(f"{url} does not exist") from None
        raise


class S3Prefix:
    """Objects under s3://BUCKET/PREFIX/, through the process's S3 client (_client) and its
    bounded waits (Patience). Problems that stop a command before its work (no bucket, no
    credentials, no endpoint, no answer) are one-line UsageErrors; `what` names the URL's flag in
    them."""

    def __init__(self, url: str, what: str, staging: Path | None = None):
        check_url(url, what)
        self.url, self.what = url.rstrip("/"), what
        parsed = urllib.parse.urlparse(self.url)
        self.bucket, self.prefix = parsed.netloc, parsed.path.strip("/")
        self.patience = Patience(f"{what} {self.url}")
        self.client, self.endpoint = self.patience.client, self.patience.endpoint
        self.staging = staging
        self._call(self.client.head_bucket, Bucket=self.bucket)

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def _call(self, method, **kwargs):
        """An S3 request, waited for within the budget; its failures that the user must fix as
        one line."""
        from botocore.exceptions import (
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        try:
            return self.patience.run(lambda: method(**kwargs))
        except (NoCredentialsError, PartialCredentialsError):
            raise UsageError(f"{self.what} {self.url}: no S3 credentials found: set "
                             f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
                             ) from None
        except EndpointConnectionError as err:
            raise UsageError(f"{self.what} {self.url}: cannot reach the S3 endpoint "
                             f"{err.kwargs.get('endpoint_url', self.endpoint)}: check "
                             f"S3_ENDPOINT_URL and the network") from None
        except ClientError as err:
            code = _error_code(err)
            if code in ("404", "NoSuchBucket") and method == self.client.head_bucket:
                raise UsageError(f"{self.what} {self.url}: the bucket {self.bucket} does not "
                                 f"exist: create it, or check the name (and S3_ENDPOINT_URL)"
                                 ) from None
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise UsageError(f"{self.what} {self.url}: access denied ({code}): check the "
                                 f"credentials and the bucket's permissions") from None
            raise

    def files(self, under: str = "") -> dict[str, int]:
        """Every object below the prefix (or below prefix/under), by path relative to the prefix,
        with its size."""
        start = self.key(under).rstrip("/") + "/" if self.key(under) else ""
        found = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                      Prefix=start)
        for page in self._call(lambda: list(pages)):
            for item in page.get("Contents", []):
                found[item["Key"][len(self.prefix) + 1 if self.prefix else 0:]] = item["Size"]
        return found

    def read(self, relative: str) -> bytes:
        return self._call(lambda: self.client.get_object(
            Bucket=self.bucket, Key=self.key(relative))["Body"].read())

    def read_json(self, relative: str):
        return json.loads(self.read(relative))

    def download(self, relative: str, local: Path) -> None:
        self._call(_get_to_file, client=self.client, bucket=self.bucket,
                   key=self.key(relative), local=local)

    def write_json(self, relative: str, obj) -> None:
        self._call(self.client.put_object, Bucket=self.bucket, Key=self.key(relative),
                   Body=json.dumps(obj, indent=1).encode())

    def upload(self, relative: str) -> None:
        """staging/relative -> prefix/relative (S3_CANNED_ACL, as streaming's uploader reads it,
        where a bucket wants one). Thread-safe."""
        acl = os.environ.get("S3_CANNED_ACL")
        self._call(self.client.upload_file, Filename=str(self.staging / relative),
                   Bucket=self.bucket, Key=self.key(relative),
                   ExtraArgs={"ACL": acl} if acl else None)

    def delete(self, relatives: list[str]) -> None:
        for start in range(0, len(relatives), 1000):  # S3's most per request
            objects = [{"Key": self.key(name)} for name in relatives[start:start + 1000]]
            self._call(self.client.delete_objects, Bucket=self.bucket,
                       Delete={"Objects": objects, "Quiet": True})


def dataset_objects(store: S3Prefix, manifest: dict) -> set[str]:
    """The objects a remote dataset consists of: manifest.json, each split's index.json and the
    shard files it lists (an index that cannot be read lists nothing)."""
    names = {FILENAME}
    for split in manifest.get("splits", {}).values():
        folder = "" if split["path"] == "." else split["path"]
        index = join("", folder, INDEX)
        names.add(index)
        try:
            shards = store.read_json(index)["shards"]
        except Exception:  # absent or damaged: its shards are found by no one's record
            continue
        names |= {join("", folder, entry[kind]["basename"]) for entry in shards
                  for kind in ("raw_data", "zip_data") if entry.get(kind)}
    return names


def remote_manifest(url: str, what: str = "data") -> dict:
    """The manifest of a finished remote data folder, checked like a local one's (read_manifest):
    a missing bucket, missing credentials or a prefix without a manifest are one line."""
    store = S3Prefix(url, what)
    if FILENAME not in store.files():
        raise UsageError(f"{what} {url} has no {FILENAME} (not a finished aogpt data folder): "
                         f"build it with `python data_prep/owt_to_mds.py --out {url}`")
    with tempfile.TemporaryDirectory(prefix="aogpt-manifest-") as tmp:
        store.download(FILENAME, Path(tmp) / FILENAME)
        return read_manifest(tmp)


def shard_size_problems(url: str, manifest: dict, what: str = "data",
                        splits: list[str] | None = None) -> list[mds.ShardProblem]:
    """What a listing of the bucket shows wrong with a remote dataset's splits (default: all):
    index.json files that are missing or unreadable and shard objects that are missing or not of
    the size their index records (no shard is read). ShardProblem.path holds the URL."""
    store = S3Prefix(url, what)
    present = store.files()
    problems = []
    for name, split in manifest["splits"].items():
        if splits is not None and name not in splits:
            continue
        folder = "" if split["path"] == "." else split["path"]
        index = join("", folder, INDEX)
        try:
            entries = store.read_json(index)["shards"]
        except UsageError:  # the store itself (credentials, endpoint): not this index's fault
            raise
        except Exception as err:
            problems.append(mds.ShardProblem(join(url, index),
                                             "missing" if index not in present else
                                             f"unreadable ({err})"))
            continue
        for entry in entries:
            info = entry.get("zip_data") or entry["raw_data"]
            name = join("", folder, info["basename"])
            size = present.get(name)
            if size is None:
                problems.append(mds.ShardProblem(join(url, name), "missing"))
            elif size != info["bytes"]:
                cut = "truncated" if size < info["bytes"] else "longer than written"
                problems.append(mds.ShardProblem(
                    join(url, name), f"{size:,} bytes, the index says {info['bytes']:,} "
                                           f"({cut})"))
    return problems


def default_staging(url: str) -> Path:
    """A node-local folder per URL (TMPDIR): --staging picks one that outlives a job."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / "aogpt-staging" / digest


class RemoteOutput:
    """--out s3://BUCKET/PREFIX: built in `staging` (an OutputDir), then uploaded (see the module
    docstring). The same calls as OutputDir: start, then the build into .work and .out, then
    publish; `built` says whether staging holds the finished dataset already (an upload was
    interrupted), so the build is skipped."""

    def __init__(self, url: str, staging: Path | None, splits: tuple[str, ...]):
        self.url = url.rstrip("/")
        self.local = StagingDir(staging or default_staging(self.url), splits, self.url,
                                default=staging is None)
        self.local.check()  # a --staging that is not the tool's own: refused before the bucket
        self.store = S3Prefix(self.url, "--out", self.local.root)
        self.work, self.out = self.local.work, self.local.out
        self.built = False
        self._claimed: set[str] = set()  # objects of an earlier build that this run replaces
        self._settings: dict | None = None
        self._builder: str | None = None

    def start(self, settings: dict, overwrite: bool) -> bool:
        """False when the bucket holds this build already; True when there is work (and staging
        is ready for it). Refuses, before anything is written, a prefix that holds objects this
        tool did not write, or a finished dataset of other settings without --overwrite."""
        settings = json.loads(json.dumps(settings))
        self._builder = settings["tool"]
        present = self.store.files()
        record = self.store.read_json(UPLOAD_RECORD) if UPLOAD_RECORD in present else None
        manifest = self.store.read_json(FILENAME) if FILENAME in present else None
        if manifest is not None and (not isinstance(manifest, dict)
                                     or manifest.get("format") != FORMAT):
            raise UsageError(f"--out {self.url} holds a {FILENAME} that is not an aogpt data "
                             f"manifest: choose an empty prefix (nothing was deleted)")
        self._check_builder(manifest, record)
        ours = {UPLOAD_RECORD, *(record or {}).get("files", [])}
        if manifest is not None:
            ours |= dataset_objects(self.store, manifest)
        foreign = sorted(set(present) - ours)
        if foreign:
            raise UsageError(f"--out {self.url} holds {foreign[0]!r}, which this tool did not "
                             f"write: move it elsewhere or choose another prefix (nothing was "
                             f"deleted)")
        if manifest is not None and record is None and not overwrite:
            if manifest.get("settings") != settings:
                raise UsageError(f"--out {self.url} holds a finished dataset built with other "
                                 f"settings or inputs: pass --overwrite to rebuild it, or choose "
                                 f"another prefix")
            return False
        resuming = record is not None and record.get("settings") == settings and not overwrite
        self._claimed = set() if resuming else (set(present) & ours)
        self._settings = settings
        self.built = not self.local.start(settings, overwrite)
        if resuming:
            print(f"resuming the interrupted upload to {self.url}", flush=True)
        return True

    def _check_builder(self, manifest: dict | None, record: dict | None) -> None:
        """Refuses a dataset or an unfinished upload that another builder made: never this
        builder's to replace, --overwrite or not."""
        this = describe_builder(self._builder)
        if manifest is not None and builder_of(manifest) != self._builder:
            raise UsageError(f"--out {self.url} holds a dataset that "
                             f"{describe_builder(builder_of(manifest))} built "
                             f"({manifest.get('dataset')}), and {this} replaces only its own, "
                             f"even with --overwrite: choose another prefix (nothing was deleted)")
        if record is not None and builder_of(record) != self._builder:
            raise UsageError(f"--out {self.url} holds an unfinished upload of "
                             f"{describe_builder(builder_of(record))} ({UPLOAD_RECORD}), "
                             f"which {this} does not replace: finish it with that command, or "
                             f"choose another prefix (nothing was deleted)")

    def finished_manifest(self) -> dict:
        return self.store.read_json(FILENAME)

    @property
    def staging_root(self) -> Path:
        return self.local.root

    def slices_root(self) -> Path:
        """Where --slice writes its slice: the staging folder, made this tool's first."""
        self.local.claim()
        return self.local.root

    def holds(self, settings: dict) -> bool:
        """Whether the bucket holds the finished dataset of these settings."""
        return (FILENAME in self.store.files() and UPLOAD_RECORD not in self.store.files()
                and self.finished_manifest().get("settings") == json.loads(json.dumps(settings)))

    def discard(self) -> None:
        self.local.discard()

    def publish(self, manifest: dict | None) -> dict:
        """Publishes the build in staging (skipped when `built`), uploads it and removes the
        staging folder; returns the manifest."""
        if not self.built:
            self.local.publish(manifest)
        manifest = read_manifest(self.local.root)
        files = self._staged_files(manifest)
        if self._claimed:  # an earlier build's objects: gone before any new one arrives
            self.store.write_json(UPLOAD_RECORD, {"builder": self._builder, "settings": None,
                                                  "files": sorted(self._claimed | set(files))})
            self.store.delete([FILENAME] if FILENAME in self._claimed else [])
            self.store.delete(sorted(self._claimed - {FILENAME, UPLOAD_RECORD}))
        self.store.write_json(UPLOAD_RECORD, {"builder": self._builder,
                                              "settings": self._settings, "files": files})
        self._upload(files)
        self.store.delete([UPLOAD_RECORD])
        self.local.remove()
        return manifest

    def _staged_files(self, manifest: dict) -> list[str]:
        """What the upload writes, in order: shards, then each index.json, manifest.json last."""
        shards, indexes = [], []
        for split in manifest["splits"].values():
            folder = "" if split["path"] == "." else split["path"]
            indexes.append(join("", folder, INDEX))
            shards += [join("", folder, entry[kind]["basename"])
                       for entry in mds.read_index(self.local.root / folder)
                       for kind in ("raw_data", "zip_data") if entry.get(kind)]
        return [*shards, *indexes, FILENAME]

    def _upload(self, files: list[str]) -> None:
        present = self.store.files()
        sizes = {name: (self.local.root / name).stat().st_size for name in files}
        todo = [name for name in files if present.get(name) != sizes[name]]
        total = sum(sizes.values())
        last = [name for name in todo if name.rsplit("/", 1)[-1] in (INDEX, FILENAME)]
        pool = ThreadPoolExecutor(UPLOAD_THREADS)
        with progress(total=total, initial=total - sum(sizes[name] for name in todo), unit="B",
                      desc=f"upload to {self.url}") as bar:
            try:
                shards = [name for name in todo if name not in last]
                for name, future in [(name, pool.submit(self.store.upload, name))
                                     for name in shards]:
                    future.result()
                    bar.update(sizes[name])
            finally:  # Ctrl-C or a failure: what is queued is not sent
                pool.shutdown(wait=True, cancel_futures=True)
            for name in last:  # the indexes, then the manifest, one after the other
                self.store.upload(name)
                bar.update(sizes[name])


def open_output(out: str | Path, staging: Path | None, splits: tuple[str, ...]
                ) -> OutputDir | RemoteOutput:
    """The builders' --out: a local folder, or a remote URL built in `staging` (default: one
    per URL under $TMPDIR)."""
    if is_remote(out):
        return RemoteOutput(str(out), staging, splits)
    return OutputDir(out, splits)
