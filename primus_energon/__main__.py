"""The ``primus-energon`` command line (also ``python -m primus_energon``): the dataset commands of
`primus_energon.datasets.commands` (finalize, validate, info, preview).

Exit status: 0 clean, 1 problems found (or a cooker rejected a previewed sample), 2 refused (bad arguments,
nothing to validate, an Energon release it cannot run on).
"""

from __future__ import annotations

import argparse
import sys
import warnings

from .datasets.commands import register as register_dataset_commands
from .environment import add_version_option, refuse_broken_environment

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The ``primus-energon`` parser: ``--version`` and the dataset commands (each sets ``handler``)."""
    parser = argparse.ArgumentParser(
        prog="primus-energon",
        description="Reference data path for diffusion training on Megatron-Energon.",
    )
    add_version_option(parser, "primus-energon")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_dataset_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``primus-energon`` on `argv` (default: the process's arguments); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    refused = refuse_broken_environment(f"primus-energon {args.command}")
    if refused is not None:
        return refused
    # Energon always asks torch for pinned memory; on a machine without an accelerator torch warns about it
    # once per loader, which says nothing about the user's data.
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator", category=UserWarning)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
