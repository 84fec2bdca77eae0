"""Problem records: what `validate` reports, one record per problem, each saying where and what to do.

A record is ``{code, severity, shard, key, member, message, hint, dataset, detail}``. `code` uses the
synthetic generator's fault-kind names where they correspond (``truncated-shard``, ``missing-member``, ...),
so a report can be compared with a generator manifest as ``(code, shard, key, member)``; the metadata and
metadataset codes are listed in `CODES`. Severity ``error`` makes validation fail; ``warning`` does not
(unless ``strict``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CODES", "Problem", "hint_for", "severity_of"]

#: code -> (severity, what to do). Hints are generic; messages carry the specifics.
CODES: dict[str, tuple[str, str]] = {
    # -- shards and samples (the generator's fault kinds) ------------------------------------------------
    "truncated-shard": (
        "error",
        "the shard file is cut short (an interrupted copy or write): copy or regenerate it, then run "
        "`primus-energon finalize DIR --force`; Energon stops iterating at this point",
    ),
    "empty-shard": (
        "error",
        "the shard holds no samples: delete it (or regenerate it) and run `primus-energon finalize DIR --force`",
    ),
    "unreadable-shard": (
        "error",
        "the shard cannot be read at all: check its permissions and the storage",
    ),
    "corrupt-shard": (
        "error",
        "the file is not a readable tar archive from this point on: regenerate the shard",
    ),
    "missing-member": (
        "error",
        "re-export the sample with all its members, or exclude it in .nv-meta/split.yaml (exclude: [shard.tar/key])",
    ),
    "garbage-payload": (
        "error",
        "the bytes are not what the member name promises: re-export the sample (tensors: torch.save of one "
        "tensor; images: JPEG/PNG/WebP; json: UTF-8 JSON)",
    ),
    "malicious-pickle": (
        "error",
        "the tensor file pickles objects other than tensors and would run code if unpickled: delete the shard "
        "and find out who wrote it; never load it with a permissive unpickler",
    ),
    "pickle-members": (
        "warning",
        "validate read these members with a restricted unpickler and they hold plain data; Energon's default "
        "SampleDecoder (pickle.loads) and other readers would run any code a tampered copy held: read them with "
        "primus_energon.safe_loads or primus_energon.SafeSampleDecoder, or re-export them as .pth/.npy",
    ),
    "non-utf8-caption": (
        "error",
        "re-encode the caption as UTF-8 (e.g. `iconv -f cp1252 -t utf-8`)",
    ),
    "nan-tensor": (
        "error",
        "the tensor holds NaN or Inf values, which poison training: re-encode the sample or exclude it",
    ),
    "wrong-dtype": (
        "error",
        "this member's dtype differs from the rest of the dataset, so batches cannot be stacked: convert it "
        "(tensor.to(dtype)) and re-save",
    ),
    "wrong-shape": (
        "error",
        "this member's shape differs from the rest of the dataset (and is not a resolution bucket), so batches "
        "cannot be stacked: re-encode it at the dataset's shape",
    ),
    "duplicate-key": (
        "error",
        "sample keys must be unique across all shards (Energon's prepare refuses duplicates): rename one of "
        "the samples and re-run finalize",
    ),
    "dotted-key": (
        "error",
        "Energon cuts member names at the first dot, so this key loses its members: rename keys without dots "
        "(e.g. replace '.' with '_') and re-run finalize",
    ),
    "unsafe-path": (
        "error",
        "the member's name is an absolute path or climbs out with '..': any tool that extracts the shard writes "
        "it outside the extraction directory. Delete the shard and find out who wrote it; rewrite it with "
        "relative names (key.member inside the shard)",
    ),
    "link-member": (
        "error",
        "the shard holds a symbolic or hard link: Energon skips it, and extracting the shard would create a link "
        "that can point anywhere. Rewrite the shard with regular files only",
    ),
    "special-member": (
        "error",
        "the shard holds a device or FIFO entry: Energon skips it, and extracting the shard would create a "
        "device node or a pipe. Rewrite the shard with regular files only",
    ),
    "control-character": (
        "error",
        "the sample key or member name holds a control character (newline, NUL, ...): it breaks index.sqlite "
        "lookups, split.yaml excludes, logs and reports. Rename the sample without control characters and "
        "re-run finalize",
    ),
    "limit-exceeded": (
        "error",
        "checking the member went past a budget (the message names it: objects, depth, bytes, time or "
        "memory); nothing from it was run and the run went on with the next member. Re-export the member "
        "within the limits, or exclude the sample; a legitimate member this large can be checked with a "
        "larger budget (validate --member-timeout / --worker-memory)",
    ),
    "check-failed": (
        "error",
        "checking the member raised an unexpected error (named in the message); nothing from it was run and "
        "the run went on with the next member. Re-export the member; if it is valid, report the message as a "
        "primus-energon bug",
    ),
    # -- metadata ------------------------------------------------------------------------------------------
    "missing-metadata": (
        "error",
        "prepare the dataset: `primus-energon finalize DIR --encoding ENCODING`",
    ),
    "bad-metadata": (
        "error",
        "the metadata file cannot be parsed: re-create it with `primus-energon finalize DIR --force`",
    ),
    "count-mismatch": (
        "error",
        "the shard changed after it was prepared: re-run `primus-energon finalize DIR --force`",
    ),
    "missing-index": (
        "error",
        "each shard needs its .tar.idx beside it: re-run `primus-energon finalize DIR --force`",
    ),
    "index-mismatch": (
        "error",
        "the .tar.idx does not match the shard (it changed after it was prepared): re-run "
        "`primus-energon finalize DIR --force`",
    ),
    "missing-shard": (
        "error",
        "a shard named in the metadata is not on disk: restore it, or re-run `primus-energon finalize DIR --force`",
    ),
    "unlisted-shard": (
        "error",
        "this tar is not in .nv-meta/.info.json, so Energon never reads it: re-run "
        "`primus-energon finalize DIR --force` (or move the file away)",
    ),
    "compressed-shard": (
        "error",
        "Energon reads shards by byte offset and cannot use compressed tars: decompress them "
        "(`primus-energon finalize DIR --decompress ...` or `gunzip -k`)",
    ),
    "split-mismatch": (
        "error",
        "fix .nv-meta/split.yaml so each split lists existing shards, or re-run `primus-energon finalize DIR --force`",
    ),
    "encoding-mismatch": (
        "error",
        "make `subflavors: {encoding: ...}` in .nv-meta/dataset.yaml name the encoding of the data "
        "(`primus-energon finalize DIR --encoding ENCODING --force`)",
    ),
    "missing-sqlite": (
        "warning",
        "index.sqlite is only needed for auxiliary datasets and random access; re-run finalize to create it",
    ),
    "excluded": (
        "warning",
        "split.yaml excludes this data, so Energon skips it",
    ),
    # -- metadatasets --------------------------------------------------------------------------------------
    "bad-metadataset": (
        "error",
        "see Energon's metadataset format: `__class__: MetadatasetV2` with `splits: {train: {blend: [...]}}`",
    ),
    "missing-path": (
        "error",
        "the entry's path is neither a prepared dataset nor a metadataset .yaml; paths are relative to the "
        "metadataset file",
    ),
    "bad-weight": (
        "error",
        "blend weights must be positive numbers",
    ),
    "duplicate-leaf": (
        "error",
        "the same dataset split is blended more than once, so its samples repeat in the same order (Energon "
        "#266): list it once with the summed weight",
    ),
}


def severity_of(code: str) -> str:
    """The severity of `code` (``error`` for unknown codes)."""
    return CODES.get(code, ("error", ""))[0]


def hint_for(code: str) -> str:
    """The generic advice for `code`."""
    return CODES.get(code, ("error", ""))[1]


@dataclass(frozen=True)
class Problem:
    """One problem. `shard` is relative to the dataset root; `key`/`member` are None when not applicable;
    `dataset` is set for problems of a metadataset's leaf; `detail` holds machine-readable extras."""

    code: str
    shard: str | None
    key: str | None
    member: str | None
    message: str
    hint: str = ""
    severity: str = ""
    dataset: str | None = None
    detail: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.severity:
            object.__setattr__(self, "severity", severity_of(self.code))
        if not self.hint:
            object.__setattr__(self, "hint", hint_for(self.code))

    @property
    def location(self) -> tuple[str | None, str | None, str | None]:
        return (self.shard, self.key, self.member)

    def where(self) -> str:
        """``shard-000001.tar key s_000012 member latents.pth`` (parts that are None are left out)."""
        parts = []
        if self.dataset:
            parts.append(self.dataset)
        if self.shard:
            parts.append(self.shard)
        if self.key is not None:
            parts.append(f"key {self.key}")
        if self.member is not None:
            parts.append(f"member {self.member}")
        return " ".join(parts) if parts else "dataset"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "code": self.code,
            "severity": self.severity,
            "shard": self.shard,
            "key": self.key,
            "member": self.member,
            "message": self.message,
            "hint": self.hint,
        }
        if self.dataset is not None:
            out["dataset"] = self.dataset
        if self.detail:
            out["detail"] = self.detail
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Problem:
        return cls(
            code=d["code"],
            shard=d.get("shard"),
            key=d.get("key"),
            member=d.get("member"),
            message=d.get("message", ""),
            hint=d.get("hint", ""),
            severity=d.get("severity", ""),
            dataset=d.get("dataset"),
            detail=dict(d.get("detail") or {}),
        )

    def with_dataset(self, dataset: str) -> Problem:
        return Problem(
            self.code,
            self.shard,
            self.key,
            self.member,
            self.message,
            self.hint,
            self.severity,
            dataset,
            self.detail,
        )
