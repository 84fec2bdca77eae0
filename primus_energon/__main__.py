"""The ``primus-energon`` command line (also ``python -m primus_energon``)."""

from __future__ import annotations

import argparse
import sys
import warnings

from . import __version__, demo
from .datasets.cli import register as register_dataset_commands

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="primus-energon",
        description="Reference data path for diffusion training on Megatron-Energon.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo_parser = commands.add_parser(
        "demo",
        help="end-to-end check of the reference data path on generated data",
        description=demo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(handler=demo.run)
    register_dataset_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Energon always asks torch for pinned memory; on a machine without an accelerator torch warns about it
    # once per loader, which says nothing about the user's data.
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator", category=UserWarning)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
