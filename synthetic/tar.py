"""Byte-deterministic tar writing (GNU format, mtime 0, uid/gid 0, mode 0644), hashing members on a side thread.

Written by hand rather than through `tarfile.TarFile.addfile` so each member is one header write plus one
payload write (no 16 KiB copy loop), and so the member digests overlap with the file writes.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

__all__ = ["EMPTY_TAR", "TarShardWriter", "tar_header"]

_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
#: what `tarfile` writes for an archive with no members: two zero blocks padded to one record
EMPTY_TAR = bytes(_RECORD)


def tar_header(name: str, size: int) -> bytes:
    """The header block(s) of a regular file `name` of `size` bytes (GNU long-name blocks when needed)."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


def _sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()  # releases the GIL for large buffers


class TarShardWriter:
    """Writes one tar to ``<path>.tmp`` and renames it to `path` on a clean close.

    `add(name, data, on_digest)` writes a member; `on_digest(sha256_hex)` is called later (at the latest by
    `close`) from the calling thread, once the side thread has hashed `data`. At most `window` members' payloads
    are kept alive waiting for their digest.
    """

    def __init__(self, path: str | os.PathLike[str], *, window: int = 8) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._file = open(self._tmp, "wb")  # noqa: SIM115 - closed in close()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="synthetic-sha256")
        self._pending: deque[tuple[Future[str], Callable[[str], None]]] = deque()
        self._window = window
        self.offset = 0

    def add(self, name: str, data: bytes | memoryview, on_digest: Callable[[str], None]) -> None:
        size = len(data) if isinstance(data, bytes) else data.nbytes
        self._pending.append((self._hasher.submit(_sha256, data), on_digest))
        header = tar_header(name, size)
        self._file.write(header)
        self._file.write(data)
        pad = -size % _BLOCK
        if pad:
            self._file.write(bytes(pad))
        self.offset += len(header) + size + pad
        while len(self._pending) > self._window:
            self._resolve_one()

    def _resolve_one(self) -> None:
        future, callback = self._pending.popleft()
        callback(future.result())

    def close(self) -> int:
        """Finish the archive (end blocks, record padding), rename it into place and return its size."""
        while self._pending:
            self._resolve_one()
        end = 2 * _BLOCK
        end += -(self.offset + end) % _RECORD
        self._file.write(bytes(end))
        self.offset += end
        self._file.close()
        self._hasher.shutdown()
        os.replace(self._tmp, self.path)
        return self.offset

    def abort(self) -> None:
        """Drop the partial file (used when generation fails)."""
        self._hasher.shutdown(cancel_futures=True)
        self._file.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> TarShardWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
