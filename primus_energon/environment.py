"""What the installed environment is, and whether it can run this project: versions from the installed
distributions' metadata (nothing is imported to learn them), known-broken combinations, and a probe that
Energon opens a local directory.

:func:`versions` and :func:`version_line` serve ``--version`` and the pytest header; :func:`problems` (cheap:
they import what the suite needs anyway) and :func:`probe_local_paths` (Energon's EPath) serve the conformance suite, which turns each
problem into one usage-error line (exit 4) with its fix instead of failing every property.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
from importlib import metadata

__all__ = [
    "DISTRIBUTIONS",
    "SUPPORTED_RANGE",
    "SUPPORTED_RANGE_TEXT",
    "release_problem",
    "release_writes_sqlite_index",
    "version",
    "versions",
    "version_line",
    "problems",
    "incompatibilities",
    "probe_local_paths",
    "MSC_FIX",
    "add_version_option",
    "refused_environment",
    "refuse_broken_environment",
]

#: The distributions whose versions a bug report needs, in the order they are shown.
DISTRIBUTIONS = (
    "primus-energon",
    "megatron-energon",
    "torch",
    "multi-storage-client",
    "webdataset",
    "hypothesis",
)

#: The fix for Energon 6.0-7.2 beside multi-storage-client 1.x.
MSC_FIX = "pip install 'multi-storage-client<1'"


def version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """``{distribution: version or None}`` for :data:`DISTRIBUTIONS`."""
    return {name: version(name) for name in DISTRIBUTIONS}


def version_line(program: str = "primus-energon") -> str:
    """``primus-energon 0.1.0 (megatron-energon 7.4.1, torch 2.13.0, multi-storage-client 1.3.1, Python 3.11.7)``."""
    import platform

    found = versions()
    own = found.pop("primus-energon") or "unknown (not installed)"
    found.pop("hypothesis")
    found.pop("webdataset")
    parts = [f"{name} {value or 'not installed'}" for name, value in found.items()]
    return f"{program} {own} ({', '.join(parts)}, Python {platform.python_version()})"


def _release(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    out = []
    for part in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit()) if not part.isdigit() else part
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():  # 1rc1: the release ends here
            break
    return tuple(out)


def problems(*, need: tuple[str, ...] = ("megatron-energon", "torch", "hypothesis")) -> list[str]:
    """What keeps the environment from running the conformance suite, one line each with its fix: a
    distribution of ``need`` that does not import (the suite imports them anyway) and the known-broken
    version pairs (:func:`incompatibilities`, from metadata). Empty when nothing is known to be wrong."""
    out = []
    installs = {
        "megatron-energon": "pip install 'megatron-energon>=5.2,<7.5'",
        "torch": "pip install torch (the build for your accelerator)",
        "hypothesis": "pip install 'primus-energon[test]' (or 'hypothesis>=6.100')",
        "webdataset": "pip install 'webdataset>=0.2.86'",
    }
    modules = {"megatron-energon": "megatron.energon", "multi-storage-client": "multistorageclient"}
    for name in need:
        module = modules.get(name, name.replace("-", "_"))
        fix = installs.get(name, f"pip install {name}")
        if importlib.util.find_spec(module.split(".")[0]) is None:
            out.append(f"{name} is not installed (no module {module}): {fix}")
            continue
        try:
            importlib.import_module(module)
        except Exception as error:  # installed but broken: say how
            detail = " ".join(f"{type(error).__name__}: {error}".split())[:200]
            out.append(f"{name} is installed but {module} does not import ({detail}): {fix}")
    out += incompatibilities(version("megatron-energon"), version("multi-storage-client"))
    return out


#: The Energon releases this project supports, ``(lowest, highest)`` as ``(major, minor)``, both included.
SUPPORTED_RANGE: tuple[tuple[int, int], tuple[int, int]] = ((5, 2), (7, 4))
SUPPORTED_RANGE_TEXT = "5.2 to 7.4"


def release_problem(found: tuple[int, ...]) -> str | None:
    """One line when the Energon release ``found`` (``(6, 0, 1)``) is outside :data:`SUPPORTED_RANGE`."""
    low, high = SUPPORTED_RANGE
    if not found or low <= tuple(found[:2]) <= high:
        return None
    shown = ".".join(str(part) for part in found)
    return (
        f"megatron-energon {shown} is outside the releases primus-energon supports ({SUPPORTED_RANGE_TEXT}): "
        f"pip install 'megatron-energon>={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}'"
    )


def release_writes_sqlite_index() -> bool:
    """Whether the installed Energon's ``prepare`` writes ``.nv-meta/index.sqlite`` (6.0 and later; read
    from metadata, nothing imported)."""
    found = _release(version("megatron-energon"))
    return not found or found >= (6, 0)


def incompatibilities(energon_version: str | None, msc_version: str | None) -> list[str]:
    """The known-broken pairs among these versions of megatron-energon and multi-storage-client, one line
    each with its fix (Energon 6.0-7.2 open local paths through multi-storage-client's ``default`` profile,
    which multi-storage-client 1.0 removed; 5.x open them directly), and a release outside the supported
    range."""
    energon, msc = _release(energon_version), _release(msc_version)
    out = []
    if energon and release_problem(energon) is not None:
        out.append(release_problem(energon))
    if energon and (6, 0) <= energon < (7, 3) and msc and msc >= (1,):
        out.append(
            f"megatron-energon {energon_version} with multi-storage-client {msc_version} cannot open local "
            'paths (Energon 6.0-7.2 open them through multi-storage-client\'s "default" profile, which '
            f'multi-storage-client 1.0 removed: Profile "default" not found): {MSC_FIX}, or upgrade to '
            "megatron-energon>=7.3"
        )
    return out


def _find(module: str) -> object | None:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def probe_local_paths() -> str | None:
    """Open a fresh temporary directory through Energon's own path layer (``EPath``): write, find and
    read one file. None when that works, else one line saying what failed and what to do."""
    from megatron.energon.epathlib import EPath

    from .energon_compat import write_text

    with tempfile.TemporaryDirectory(prefix="primus-energon-probe-") as tmp:
        try:
            path = EPath(tmp)
            write_text(path / "probe.txt", "ok")
            if not (
                path.is_dir() and (path / "probe.txt").is_file() and (path / "probe.txt").read_text() == "ok"
            ):
                raise OSError("wrote a file it then could not read back")
        except Exception as error:
            detail = " ".join(f"{type(error).__name__}: {error}".split())[:300]
            energon = _release(version("megatron-energon"))
            if energon and (6, 0) <= energon < (7, 3) and os.environ.get("MSC_CONFIG"):
                fix = (
                    f"the multi-storage-client configuration MSC_CONFIG={os.environ['MSC_CONFIG']} has no "
                    "'default' profile, which Energon 6.0-7.2 open local paths with: add "
                    "`default: {storage_provider: {type: file, options: {base_path: /}}}` to its profiles"
                )
            elif energon and (6, 0) <= energon < (7, 3):
                fix = f"{MSC_FIX} (Energon 6.0-7.2 need its 0.x releases for local paths)"
            else:
                fix = "check the multi-storage-client configuration (MSC_CONFIG, ~/.msc_config.yaml)"
            return (
                f"megatron-energon {version('megatron-energon')} cannot open a local directory through its EPath "
                f"({detail}): {fix}"
            )
    return None


def refuse_broken_environment(program: str) -> int | None:
    """For a command-line tool: print :func:`refused_environment`'s line as ``program``'s error and return
    exit status 2, or return None when nothing is known to be wrong."""
    import sys

    refused = refused_environment()
    if refused is None:
        return None
    print(f"{program}: error: {refused}", file=sys.stderr)
    return 2


def refused_environment() -> str | None:
    """The first known-broken thing about the installed Energon, one line with its fix (read from
    metadata, nothing imported): a release outside the supported range, or a release beside a
    multi-storage-client it cannot open local paths with. The command-line tools refuse to start on it
    rather than end in a traceback."""
    found = incompatibilities(version("megatron-energon"), version("multi-storage-client"))
    return found[0] if found else None


def add_version_option(parser: argparse.ArgumentParser, program: str) -> None:
    """``--version``: print :func:`version_line` on one line (argparse's own action wraps it) and exit 0."""

    class _Version(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
            print(version_line(program))
            parser.exit()

    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="show the versions of primus-energon, megatron-energon, torch and multi-storage-client, and exit",
    )
