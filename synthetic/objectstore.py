"""An S3-compatible object store on the loopback address, holding generated datasets: the remote half of a
test or a benchmark, with real HTTP, real ranged GETs and a real multi-storage-client profile.

Example::

    from primus_energon.synthetic import LoopbackObjectStore, generate_dataset

    generate_dataset("data/pre", num_samples=32, shard_size=8)
    with LoopbackObjectStore() as store:          # moto's S3 server on 127.0.0.1, a free port
        url = store.upload("data/pre", "pre")     # 'msc://loopback/pre'; MSC_CONFIG points at the store
        ...                                       # validate_path(url), get_loader(url, ...)

The server is moto's standalone S3 server (``pip install "moto[server]"``; a test dependency), in memory,
in a thread of this process; it stops, and ``MSC_CONFIG`` is restored, when the context ends. Child
processes started inside the context (pool workers, loader workers, torchrun ranks) inherit ``MSC_CONFIG``
and reach the server over TCP.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["LoopbackObjectStore"]

#: the credentials moto accepts (any non-empty pair); nothing here leaves the loopback address
_ACCESS_KEY, _SECRET_KEY, _REGION = "primus-energon", "primus-energon", "us-east-1"


class LoopbackObjectStore:
    """moto's S3 server on ``127.0.0.1`` with one bucket, and an msc profile (`profile`) whose base path is
    that bucket: ``msc://PROFILE/PREFIX`` is object ``PREFIX/...`` of the bucket."""

    def __init__(self, *, profile: str = "loopback", bucket: str = "datasets", port: int = 0) -> None:
        self.profile = profile
        self.bucket = bucket
        self._port = port
        self._server: Any = None
        self._config_dir: tempfile.TemporaryDirectory[str] | None = None
        self._saved_config: str | None = None
        self.endpoint_url = ""
        self.config_file: Path | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> LoopbackObjectStore:
        """Start the server, create the bucket, write the msc profile and point ``MSC_CONFIG`` at it."""
        try:
            from moto.server import ThreadedMotoServer
        except ImportError as error:  # pragma: no cover - the test extra installs it
            raise RuntimeError(
                'LoopbackObjectStore needs moto\'s S3 server: pip install "moto[server]"'
            ) from error
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self._port, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        self.client().create_bucket(Bucket=self.bucket)
        self._config_dir = tempfile.TemporaryDirectory(prefix="primus-energon-msc-")
        self.config_file = Path(self._config_dir.name) / "msc_config.yaml"
        self.config_file.write_text(self.msc_config(), encoding="utf-8")
        self._saved_config = os.environ.get("MSC_CONFIG")
        os.environ["MSC_CONFIG"] = str(self.config_file)
        return self

    def stop(self) -> None:
        """Stop the server and restore ``MSC_CONFIG``."""
        if self._server is not None:
            self._server.stop()
            self._server = None
            self._forget_client()
        if self.config_file is not None:
            if self._saved_config is None:
                os.environ.pop("MSC_CONFIG", None)
            else:
                os.environ["MSC_CONFIG"] = self._saved_config
            self.config_file = None
        if self._config_dir is not None:
            self._config_dir.cleanup()
            self._config_dir = None

    def _forget_client(self) -> None:
        # multi-storage-client keeps one client per profile name for the life of the process and has no
        # public way to drop it; without this, a later store with the same profile (another port) would be
        # reached through the client of this stopped one
        try:
            from multistorageclient import shortcuts
        except ImportError:  # pragma: no cover - an Energon dependency
            return
        cache = getattr(shortcuts, "_STORAGE_CLIENT_CACHE", None)
        if isinstance(cache, dict):
            cache.pop(self.profile, None)

    def __enter__(self) -> LoopbackObjectStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- use -----------------------------------------------------------------------------------------------
    def msc_config(self) -> str:
        """The multi-storage-client configuration (YAML) with this store's profile."""
        # "default" is the local file system: Energon 7.0-7.2 open local paths through it, and
        # multi-storage-client < 1 has it only when no configuration file is given
        return (
            "profiles:\n"
            "  default:\n"
            "    storage_provider:\n"
            "      type: file\n"
            "      options:\n"
            "        base_path: /\n"
            f"  {self.profile}:\n"
            "    storage_provider:\n"
            "      type: s3\n"
            "      options:\n"
            f"        base_path: {self.bucket}\n"
            f"        endpoint_url: {self.endpoint_url}\n"
            f"        region_name: {_REGION}\n"
            "    credentials_provider:\n"
            "      type: S3Credentials\n"
            "      options:\n"
            f"        access_key: {_ACCESS_KEY}\n"
            f"        secret_key: {_SECRET_KEY}\n"
        )

    def client(self) -> Any:
        """A boto3 S3 client for the store (plain reads and writes, beside Energon's)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=_ACCESS_KEY,
            aws_secret_access_key=_SECRET_KEY,
            region_name=_REGION,
        )

    def url(self, prefix: str) -> str:
        """``msc://PROFILE/PREFIX``."""
        return f"msc://{self.profile}/{prefix.strip('/')}"

    def upload(self, directory: str | os.PathLike[str], prefix: str) -> str:
        """Every file below `directory` (hidden ones too: ``.nv-meta/``) as objects under `prefix`; the
        dataset's URL."""
        root = Path(directory)
        s3 = self.client()
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            key = f"{prefix.strip('/')}/{path.relative_to(root).as_posix()}"
            s3.upload_file(str(path), self.bucket, key)
        return self.url(prefix)

    def put(self, key: str, data: bytes) -> None:
        """Write one object (`key` relative to the bucket)."""
        self.client().put_object(Bucket=self.bucket, Key=key, Body=data)

    def keys(self, prefix: str = "") -> list[str]:
        """The object keys under `prefix`, sorted."""
        s3 = self.client()
        out: list[str] = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out += [obj["Key"] for obj in page.get("Contents", [])]
        return sorted(out)
