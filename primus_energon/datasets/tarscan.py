"""A strict, streaming reader of one tar shard: member by member, with Energon's key/member split.

Unlike `tarfile`, which silently ends an archive at a cut header or a missing end marker, `iter_members`
raises `TarTruncated` naming the member being read when the file ends early, and `TarCorrupt` for a header
that is not a tar header. Local shards are memory-mapped (`open_shard`), so payloads are checked in place in
the page cache, without a copy; remote ones are streamed in ranged reads (`primus_energon.storage`). Supports ustar, GNU long names and pax ``path``/``size`` records (what ``tarfile``,
webdataset and GNU tar write). Non-regular entries (directories, links, devices, FIFOs) are skipped, as
Energon does, unless ``special=True`` asks for them (with their `TarMember.type`), so that `validate` can
name the ones an extracting tool would turn into a link or a device. A declared size is checked against
the bytes that are there before anything is read; a size that is not a number is `TarCorrupt`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..storage import ForwardWindow

__all__ = [
    "SKIP_META_RE",
    "SPLIT_NAME_RE",
    "TarCorrupt",
    "TarMember",
    "TarReader",
    "TarTruncated",
    "control_characters",
    "iter_members",
    "open_shard",
    "split_name",
    "unsafe_path",
]

#: Energon's member-name split (flavors/webdataset/config.py): key = everything up to the first dot of the
#: basename, member ("part") = the rest.
SPLIT_NAME_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
#: names Energon skips (``__key__``-style metadata entries)
SKIP_META_RE = re.compile(r"__[^/]*__($|/)")

_BLOCK = tarfile.BLOCKSIZE
_ZERO_BLOCK = bytes(_BLOCK)
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE)
#: entry types other than regular files, as `TarMember.type` names them
_SPECIAL = {
    tarfile.DIRTYPE: "directory",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
    tarfile.CHRTYPE: "character-device",
    tarfile.BLKTYPE: "block-device",
    tarfile.FIFOTYPE: "fifo",
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def unsafe_path(name: str) -> str | None:
    """Why extracting an entry named `name` would write outside the directory it is extracted into
    (``"absolute path"``, ``"'..' component"``), or None."""
    if name.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", name) or name.startswith("\\"):
        return "absolute path"
    if ".." in re.split(r"[/\\]", name):
        return "'..' component"
    return None


def control_characters(text: str) -> list[str]:
    """The control characters in `text` (newline, NUL, ...), as ``repr`` escapes, first-seen order."""
    found: list[str] = []
    for c in _CONTROL.findall(text):
        shown = repr(c)[1:-1]
        if shown not in found:
            found.append(shown)
    return found


def split_name(name: str) -> tuple[str, str] | None:
    """``"a/b_01.latents.pth"`` -> ``("a/b_01", "latents.pth")``; None for names Energon ignores."""
    if SKIP_META_RE.match(name):
        return None
    m = SPLIT_NAME_RE.match(name)
    return (m.group(1), m.group(2)) if m else None


@dataclass(frozen=True)
class TarMember:
    """One regular file entry. `offset` is where its first header block starts (Energon's sample offsets
    are these), `data_offset` where its bytes start; `key`/`part` are None for names Energon ignores."""

    name: str
    key: str | None
    part: str | None
    offset: int
    data_offset: int
    size: int
    #: ``"file"``, or (only with ``TarReader(special=True)``) one of ``directory``, ``symlink``,
    #: ``hardlink``, ``character-device``, ``block-device``, ``fifo``
    type: str = "file"
    #: the target of a link (None for other entries)
    linkname: str | None = None


class TarTruncated(Exception):
    """The file ends inside member `name` (its header or its data), or before the end-of-archive marker
    (`name` None)."""

    def __init__(self, message: str, *, name: str | None, offset: int, expected: int, available: int) -> None:
        super().__init__(message)
        self.name = name
        self.offset = offset
        self.expected = expected
        self.available = available


class TarCorrupt(Exception):
    """A block that should be a tar header is not one (bad checksum, garbage)."""

    def __init__(self, message: str, *, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


def _parse_pax(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            break
        if length <= 0:
            break
        record = data[space + 1 : pos + length - 1]
        k, _, v = record.partition(b"=")
        out[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _byte_sum(block: bytes) -> int:
    """``sum(block)`` of a 512-byte header, five times faster: Adler-32's low half is 1 + the byte sum modulo
    65521, and a 256-byte half sums to at most 65280, so each half's sum comes out exact."""
    return (zlib.adler32(block[:256]) & 0xFFFF) + (zlib.adler32(block[256:]) & 0xFFFF) - 2


def _fast_header(block: bytes) -> tuple[str, int, bytes] | None:
    """(name, size, type) of a plain ustar/GNU header with a valid checksum and an octal size, else None
    (the caller then lets `tarfile` parse it, or reject it)."""
    magic = block[257:263]
    if magic not in (b"ustar\x00", b"ustar "):
        return None
    try:
        size = int(block[124:136].split(b"\x00", 1)[0].strip() or b"0", 8)
        chksum = int(block[148:156].split(b"\x00", 1)[0].strip() or b"-1", 8)
    except ValueError:
        return None
    if chksum != _byte_sum(block) - sum(block[148:156]) + 256:
        return None
    name = block[:100].split(b"\x00", 1)[0]
    if magic == b"ustar\x00" and block[345] != 0:
        name = block[345:500].split(b"\x00", 1)[0] + b"/" + name
    return name.decode("utf-8", "surrogateescape"), size, block[156:157]


class TarReader:
    """Iterates ``(member, payload)`` over every regular file of the tar held in `data`, in order.

    `data` is the whole archive (bytes, or an `mmap.mmap` of the shard: then payloads are zero-copy views of
    the page cache), or a `primus_energon.storage.ForwardWindow` streaming a remote shard. `payload` is a
    memoryview into `data` (None unless `read_data`), released when the iteration moves on: keep no
    reference to it. Iteration raises `TarTruncated` / `TarCorrupt` at the point
    the archive breaks (members before it have been yielded). When it ends normally, the archive ended
    properly and `end_offset` is where its end-of-archive marker starts (Energon's last index entry).
    `special`: also yield directories, links, devices and FIFOs (payload None, `TarMember.type` says which).
    """

    def __init__(
        self,
        data: bytes | bytearray | memoryview | mmap.mmap | ForwardWindow,
        *,
        read_data: bool = True,
        special: bool = False,
    ) -> None:
        self.data = data
        self.read_data = read_data
        self.special = special
        self.end_offset: int | None = None

    def __iter__(self) -> Iterator[tuple[TarMember, memoryview | None]]:
        return _iterate(self)


def iter_members(
    data: bytes | bytearray | memoryview | mmap.mmap, *, read_data: bool = True
) -> Iterator[tuple[TarMember, memoryview | None]]:
    """``iter(TarReader(data, read_data=read_data))``."""
    return iter(TarReader(data, read_data=read_data))


def _iterate(reader: TarReader) -> Iterator[tuple[TarMember, memoryview | None]]:
    read_data = reader.read_data
    # a ForwardWindow is sliced like a memoryview, forward only (which is how a tar is read)
    view: Any = reader.data if isinstance(reader.data, ForwardWindow) else memoryview(reader.data)
    file_size = len(view)
    pos = 0
    long_name: str | None = None
    long_link: str | None = None
    pax: dict[str, str] = {}
    chain_start: int | None = None
    try:
        while True:
            header_at = pos
            block = bytes(view[pos : pos + _BLOCK])
            pos += len(block)
            if len(block) < _BLOCK:
                if not block and chain_start is None:
                    raise TarTruncated(
                        f"the file ends at byte {header_at} without the tar end-of-archive marker",
                        name=None,
                        offset=header_at,
                        expected=_BLOCK,
                        available=0,
                    )
                raise TarTruncated(
                    f"the file ends inside a tar header at byte {header_at} ({len(block)} of 512 bytes)",
                    name=long_name or pax.get("path"),
                    offset=header_at,
                    expected=_BLOCK,
                    available=len(block),
                )
            if block == _ZERO_BLOCK:
                if chain_start is not None:
                    raise TarCorrupt(
                        f"a long-name header at byte {chain_start} is followed by no entry", offset=pos
                    )
                reader.end_offset = header_at
                return  # end-of-archive (one or two zero blocks; Energon and tarfile stop at the first)
            fast = _fast_header(block)
            if fast is not None:
                hname, hsize, htype = fast
            else:
                try:
                    info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
                except tarfile.TarError as exc:
                    raise TarCorrupt(
                        f"the block at byte {header_at} is not a tar header ({exc})", offset=header_at
                    ) from None
                hname, hsize, htype = info.name, info.size, info.type
            if chain_start is None:
                chain_start = header_at
            try:
                size = int(pax["size"]) if "size" in pax else hsize
            except ValueError:
                raise TarCorrupt(
                    f"the pax header before byte {header_at} declares size {pax['size'][:40]!r}, not a number",
                    offset=header_at,
                ) from None
            if size < 0:
                raise TarCorrupt(
                    f"the tar header at byte {header_at} declares a negative size", offset=header_at
                )
            padded = size + (-size % _BLOCK)
            if htype in _EXTENDED:
                if pos + padded > file_size:
                    raise TarTruncated(
                        f"the file ends inside an extended tar header at byte {header_at}",
                        name=None,
                        offset=header_at,
                        expected=padded,
                        available=max(0, file_size - pos),
                    )
                payload = bytes(view[pos : pos + size])
                pos += padded
                if htype == tarfile.GNUTYPE_LONGNAME:
                    long_name = payload.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                elif htype == tarfile.GNUTYPE_LONGLINK:
                    long_link = payload.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                elif htype == tarfile.XHDTYPE:
                    pax.update(_parse_pax(payload))
                continue  # longlink targets and global pax headers do not name a member
            name = long_name or pax.get("path") or hname
            linkname = long_link or pax.get("linkpath")
            start = chain_start
            long_name, long_link, pax, chain_start = None, None, {}, None
            data_at = pos
            if data_at + size > file_size:
                raise TarTruncated(
                    f"the file ends inside {name!r}: {file_size - data_at} of {size} bytes present",
                    name=name,
                    offset=start,
                    expected=size,
                    available=max(0, file_size - data_at),
                )
            pos += padded
            if htype not in _REGULAR:
                kind = _SPECIAL.get(htype)
                if reader.special and kind is not None:
                    if linkname is None and kind in ("symlink", "hardlink"):
                        linkname = block[157:257].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                    split = split_name(name)
                    yield (
                        TarMember(
                            name,
                            split[0] if split else None,
                            split[1] if split else None,
                            start,
                            data_at,
                            size,
                            kind,
                            linkname,
                        ),
                        None,
                    )
                continue
            split = split_name(name)
            member = TarMember(
                name, split[0] if split else None, split[1] if split else None, start, data_at, size
            )
            if not read_data:
                yield member, None
                continue
            payload_view = view[data_at : data_at + size]
            try:
                yield member, payload_view
            finally:
                with contextlib.suppress(BufferError):  # a consumer kept a view: it stays valid for it
                    payload_view.release()
    finally:
        if isinstance(view, memoryview):
            with contextlib.suppress(BufferError):
                view.release()


def open_shard(path: str | os.PathLike[str] | Any) -> mmap.mmap | bytes | ForwardWindow:
    """The shard's bytes for `TarReader`: a read-only mmap (the file's contents where it cannot be mapped;
    ``b""`` for an empty file), or for a `primus_energon.storage.RemotePath` a `ForwardWindow` streaming
    it. Close the result when done. Raises OSError if the shard cannot be read."""
    if not isinstance(path, (str, os.PathLike)):
        return path.open_window()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # a file system without mmap
            return f.read()
    with contextlib.suppress(AttributeError, OSError):
        mm.madvise(mmap.MADV_SEQUENTIAL)
    return mm
