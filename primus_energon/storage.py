"""Dataset locations: a local directory, or a prefix on object storage read through Energon's own path layer.

`dataset_path` turns what a user typed into the object the tools work on: a `pathlib.Path` for a local path
(unchanged, so local reads keep their memory-mapped fast path), a `RemotePath` for a URL Energon's
``EPath`` opens (``msc://PROFILE/prefix``, and ``rclone://`` / ``dss://`` where Energon supports them).
Never turn a URL into a ``pathlib.Path``: it collapses the double slash (``msc:/profile/prefix``).

`RemotePath` offers the read-only part of ``pathlib.Path`` that the dataset tools use (``/``, ``name``,
``parent``, ``is_dir``, ``is_file``, ``stat().st_size``, ``read_text``, ``iterdir``, ...). A directory is
listed once, with sizes, in one recursive listing; paths below it answer from that snapshot without a
request. Shards are streamed with ranged reads (`open_window`), one chunk ahead, never copied whole.
Profiles come from multi-storage-client's configuration (the file named by ``MSC_CONFIG``, else
``~/.msc_config.yaml``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = [
    "DatasetPath",
    "ForwardWindow",
    "RemotePath",
    "RemoteStat",
    "RemoteStorageError",
    "dataset_dir",
    "dataset_path",
    "is_remote",
]

#: URL schemes Energon's EPath opens remotely (``file://`` is local and becomes a `pathlib.Path`)
REMOTE_SCHEMES = ("msc", "rclone", "dss")
#: bytes per ranged read when streaming a shard
CHUNK_BYTES = 16 << 20


class RemoteStorageError(OSError):
    """A remote location cannot be opened or read (unknown profile, unreachable endpoint, failed read)."""


def is_remote(path: object) -> bool:
    """Whether `path` names a location on object storage (a `RemotePath`, or a string such as
    ``msc://profile/prefix``)."""
    if isinstance(path, RemotePath):
        return True
    if not isinstance(path, str) or "://" not in path:
        return False
    return path.split("://", 1)[0] in REMOTE_SCHEMES


def dataset_path(path: str | os.PathLike[str] | RemotePath) -> DatasetPath:
    """The location `path` names: a `RemotePath` for a remote URL, else a `pathlib.Path` (``~`` expanded,
    ``file://`` stripped). Raises `RemoteStorageError` when a remote profile cannot be resolved."""
    if isinstance(path, (RemotePath, Path)):
        return path
    text = os.fspath(path)
    if is_remote(text):
        return RemotePath(text)
    if text.startswith("file://"):
        text = text[len("file://") :]
    return Path(os.path.expanduser(text))


def dataset_dir(path: str | os.PathLike[str] | RemotePath) -> DatasetPath:
    """`dataset_path` for a directory that is about to be walked: a remote one is listed once, on first use,
    and everything below it answers from that listing (`RemotePath.snapshot`)."""
    location = dataset_path(path)
    return location.snapshot() if isinstance(location, RemotePath) else location


@dataclass(frozen=True)
class RemoteStat:
    """What `RemotePath.stat` knows: the object's size."""

    st_size: int


class _Snapshot:
    """One recursive listing of a remote directory: relative POSIX path -> size, taken on first use."""

    def __init__(self, top: RemotePath) -> None:
        self.top = top
        self._files: dict[str, int] | None = None

    @property
    def files(self) -> dict[str, int]:
        if self._files is None:
            self._files = self.top._list_recursive()
        return self._files


class RemotePath:
    """A file or directory on object storage (see the module docstring); compares and hashes by URL."""

    __slots__ = ("_epath", "_snapshot", "_rel", "_size")

    def __init__(self, url: str | Any, *, _snapshot: _Snapshot | None = None, _rel: str = "") -> None:
        from megatron.energon.epathlib import EPath

        if isinstance(url, EPath):
            self._epath = url
        else:
            try:
                self._epath = EPath(str(url))
            except Exception as error:  # msc raises several types for an unknown or broken profile
                raise RemoteStorageError(
                    f"cannot open {url}: {type(error).__name__}: {error}. Remote profiles come from "
                    "multi-storage-client's configuration: the file named by MSC_CONFIG, else "
                    "~/.msc_config.yaml"
                ) from error
        self._snapshot = _snapshot
        self._rel = _rel
        self._size: int | None = None  # stat()'s answer, kept: a shard is sized, then opened

    # -- naming --------------------------------------------------------------------------------------------
    @property
    def epath(self) -> Any:
        """Energon's ``EPath`` for this location (what Energon's own loaders take)."""
        return self._epath

    @property
    def url(self) -> str:
        return str(self._epath)

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemotePath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(("RemotePath", self.url))

    @property
    def name(self) -> str:
        return self._epath.name

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def parent(self) -> RemotePath:
        if self._snapshot is not None and self._rel:
            rel = PurePosixPath(self._rel).parent.as_posix()
            return RemotePath(self._epath.parent, _snapshot=self._snapshot, _rel="" if rel == "." else rel)
        return RemotePath(self._epath.parent)

    def __truediv__(self, other: str | os.PathLike[str]) -> RemotePath:
        part = PurePosixPath(os.fspath(other)).as_posix()
        if part.startswith("/") or "://" in part:
            return dataset_path(part)  # type: ignore[return-value]  # an absolute part replaces the path
        rel = part if not self._rel else f"{self._rel}/{part}"
        listed = self._snapshot is not None
        return RemotePath(self._epath / part, _snapshot=self._snapshot, _rel=rel if listed else "")

    # pathlib's no-ops for a location that is always absolute
    def absolute(self) -> RemotePath:
        return self

    def resolve(self) -> RemotePath:
        return self

    def expanduser(self) -> RemotePath:
        return self

    def is_absolute(self) -> bool:
        return True

    # -- what is there -------------------------------------------------------------------------------------
    def _fs_path(self) -> str:
        # EPath has no public listing with sizes (walk() + size() costs one request per object), so the
        # listing goes through EPath's own storage client, with the path EPath itself hands it.
        return getattr(self._epath, "_internal_str_path", str(self._epath.internal_path))

    def _list_recursive(self) -> dict[str, int]:
        base = self._fs_path().rstrip("/")
        prefix = base.lstrip("/") + "/" if base.strip("/") else ""
        files: dict[str, int] = {}
        try:
            for obj in self._epath.fs.list(base + "/"):
                key = obj.key.lstrip("/")
                if getattr(obj, "type", "file") != "file" or not key.startswith(prefix):
                    continue
                files[key[len(prefix) :]] = int(obj.content_length)
        except FileNotFoundError:
            return {}
        except Exception as error:
            raise RemoteStorageError(
                f"cannot list {self.url}: {type(error).__name__}: {error}. Check the endpoint and the "
                f"credentials of profile {self._epath.profile!r} in the multi-storage-client configuration "
                f"({os.environ.get('MSC_CONFIG') or '~/.msc_config.yaml'})"
            ) from error
        return dict(sorted(files.items()))

    def _listed(self) -> dict[str, int] | None:
        """This location's view of its snapshot: {relative path below self: size}; None without one."""
        if self._snapshot is None:
            return None
        files = self._snapshot.files
        if not self._rel:
            return files
        prefix = self._rel + "/"
        return {k[len(prefix) :]: v for k, v in files.items() if k.startswith(prefix)}

    def snapshot(self) -> RemotePath:
        """This directory with its listing taken (one recursive listing); paths made from it with ``/``
        answer ``is_file``, ``is_dir``, ``stat`` and ``iterdir`` from it without a request."""
        if self._snapshot is not None:
            return self
        return RemotePath(self._epath, _snapshot=_Snapshot(self), _rel="")

    def is_dir(self) -> bool:
        listed = self._listed()
        if listed is None:
            return bool(self.snapshot()._listed())
        return bool(listed)

    def is_file(self) -> bool:
        if self._snapshot is not None and self._rel:
            return self._rel in self._snapshot.files
        try:
            return bool(self._epath.is_file())
        except Exception as error:
            raise RemoteStorageError(f"cannot look up {self.url}: {type(error).__name__}: {error}") from error

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def stat(self) -> RemoteStat:
        """The object's size; raises FileNotFoundError for a missing object."""
        if self._snapshot is not None and self._rel:
            size = self._snapshot.files.get(self._rel)
            if size is None:
                raise FileNotFoundError(f"{self.url} does not exist")
            return RemoteStat(size)
        if self._size is not None:
            return RemoteStat(self._size)
        try:
            self._size = int(self._epath.size())
            return RemoteStat(self._size)
        except FileNotFoundError:
            raise
        except Exception as error:
            raise RemoteStorageError(f"cannot look up {self.url}: {type(error).__name__}: {error}") from error

    def iterdir(self) -> Iterator[RemotePath]:
        """The files and directories directly below this directory, sorted by name."""
        here = self if self._snapshot is not None else self.snapshot()
        children = sorted({rel.split("/", 1)[0] for rel in here._listed() or {}})
        for child in children:
            yield here / child

    def walk_files(self) -> Iterator[tuple[str, int]]:
        """(relative POSIX path, size) of every file below this directory, sorted by path."""
        here = self if self._snapshot is not None else self.snapshot()
        yield from (here._listed() or {}).items()

    # -- reading -------------------------------------------------------------------------------------------
    def read_bytes(self) -> bytes:
        try:
            return self._epath.read_bytes()
        except FileNotFoundError:
            raise
        except Exception as error:
            raise RemoteStorageError(f"cannot read {self.url}: {type(error).__name__}: {error}") from error

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def read_range(self, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset + size)`` of the object (fewer at its end), in one ranged read."""
        from multistorageclient.types import Range

        try:
            data = self._epath.fs.read(self._fs_path(), byte_range=Range(offset=offset, size=size))
        except FileNotFoundError:
            raise
        except Exception as error:
            raise RemoteStorageError(
                f"reading bytes {offset}-{offset + size} of {self.url} failed: {type(error).__name__}: {error}"
            ) from error
        return bytes(data)

    def open_window(self, *, chunk: int = CHUNK_BYTES) -> ForwardWindow:
        """The object as a forward-only buffer for `primus_energon.datasets.tarscan.TarReader`, streamed in
        ranged reads of `chunk` bytes with the next one read ahead. Close it when done."""
        return ForwardWindow(self.read_range, self.stat().st_size, chunk=chunk)


#: a dataset location: local or remote
DatasetPath = Path | RemotePath


class ForwardWindow:
    """A read-only, forward-only view of `size` bytes fetched by ``read(offset, n)`` in `chunk`-sized pieces:
    ``window[a:b]`` is a memoryview of those bytes (shorter at the end). Bytes before the last slice's
    start may be dropped (asking for them again raises ValueError); a jump forward skips the bytes between
    without reading them. While the caller
    works on one chunk, a thread reads the next (`readahead`)."""

    def __init__(
        self,
        read: Callable[[int, int], bytes],
        size: int,
        *,
        chunk: int = CHUNK_BYTES,
        readahead: bool = True,
    ) -> None:
        self._read = read
        self._size = size
        self._chunk = max(1, chunk)
        self._buf = b""
        self._start = 0  # offset of _buf[0]; _start + len(_buf) is the next byte not yet fetched
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="shard-readahead") if readahead else None
        self._ahead: tuple[int, Future[bytes]] | None = None

    def __len__(self) -> int:
        return self._size

    def _pull(self, offset: int) -> bytes:
        n = min(self._chunk, self._size - offset)
        if n <= 0:
            return b""
        if self._ahead is not None and self._ahead[0] == offset:
            data = self._ahead[1].result()
        else:
            data = self._read(offset, n)
        self._ahead = None
        end = offset + len(data)
        if len(data) < n:
            self._size = end  # the object is shorter than listed: it ends here
        elif self._pool is not None and end < self._size:
            self._ahead = (end, self._pool.submit(self._read, end, min(self._chunk, self._size - end)))
        return data

    def __getitem__(self, span: slice) -> memoryview:
        start = span.start or 0
        stop = min(self._size if span.stop is None else span.stop, self._size)
        if start < self._start:
            raise ValueError(f"ForwardWindow reads forward only (asked for byte {start}, at {self._start})")
        end = self._start + len(self._buf)
        if stop <= end:
            return memoryview(self._buf)[start - self._start : max(start, stop) - self._start]
        parts = [self._buf[start - self._start :]] if start < end else []
        pos = max(start, end)
        while pos < stop:
            data = self._pull(pos)
            if not data:
                break
            parts.append(data)
            pos += len(data)
            stop = min(stop, self._size)
        self._buf = parts[0] if len(parts) == 1 else b"".join(parts)
        self._start = start
        return memoryview(self._buf)[: max(0, stop - start)]

    def close(self) -> None:
        """Stop the read-ahead thread (a read in flight finishes in the background and is dropped)."""
        self._ahead = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._buf = b""
