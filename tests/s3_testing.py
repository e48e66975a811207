"""A real S3 server for the tests: moto's standalone server (`python -m moto.server`, pinned in
requirements/pinned.txt), a separate process on 127.0.0.1 that speaks the S3 protocol over HTTP.

The commands under test reach it as they reach any S3-compatible store: S3_ENDPOINT_URL (read by
streaming's S3 client and by aogpt's) and credentials in the environment (dummy ones: the server
accepts any). Nothing is mocked inside the processes under test.

SilentServer is an endpoint that accepts connections and never answers (a store that hangs, a
firewall that lets the handshake through): what the bounded waits are tested against.
CutShortServer answers every request with the start of a body and then closes the connection
(a store that goes away while an object streams in).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from aogpt.trainer.dist_env import free_port

# moto's server and boto3 come with the test requirements; a machine without them (the lent GPU
# machine's image) skips the S3 tests instead of failing to collect them
boto3 = pytest.importorskip("boto3")

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "aogpt-tests", "AWS_SECRET_ACCESS_KEY": "aogpt-tests",
               "AWS_DEFAULT_REGION": "us-east-1"}
START_TIMEOUT_S = 60


class S3Server:
    """One server process on a free port; `env` is what a client process needs to reach it."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {"S3_ENDPOINT_URL": self.url, **CREDENTIALS}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the S3 test server did not start on {self.url}")
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.url}/moto-api/", timeout=2).close()
            return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    @functools.cached_property
    def client(self):
        return boto3.session.Session(
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"]).client("s3", endpoint_url=self.url)

    def bucket(self, name: str) -> str:
        """A new empty bucket; its s3:// URL."""
        self.client.create_bucket(Bucket=name)
        return f"s3://{name}"

    def objects(self, url: str) -> dict[str, int]:
        """The objects below an s3:// URL, by key relative to it, with their sizes."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                        Prefix=prefix)
        return {item["Key"][len(prefix):]: item["Size"]
                for page in pages for item in page.get("Contents", [])}

    def read(self, url: str) -> bytes:
        bucket, _, key = url.removeprefix("s3://").partition("/")
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def write(self, url: str, data: bytes) -> None:
        bucket, _, key = url.removeprefix("s3://").partition("/")
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


class SilentServer:
    """A socket on 127.0.0.1 that accepts every connection and never answers (nor closes it):
    `env` points a client process at it as at an S3 store. A context manager."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.env = {"S3_ENDPOINT_URL": self.url, **CREDENTIALS}
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.socket.accept()[0])  # held open, never read or written
            except OSError:  # closed
                return

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.socket.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        except OSError:
            pass
        self.socket.close()
        for connection in self.held:
            connection.close()


class CutShortServer(SilentServer):
    """Answers each request with a 200 that promises BODY bytes, sends a few of them, and closes
    the connection: the object's body is cut short, as when a store goes away mid-download."""

    BODY = 1000

    def _accept(self) -> None:
        while True:
            try:
                connection = self.socket.accept()[0]
            except OSError:  # closed
                return
            with connection:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = connection.recv(65536)
                    if not chunk:
                        break
                    request += chunk
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream"
                                   + f"\r\nContent-Length: {self.BODY}\r\n\r\n".encode()
                                   + b"x" * 10)
