"""The dataset subcommands of ``primus-energon``, one module each: `finalize`, `validate`, `info`, `preview`.

A command module holds ``NAME``, ``HELP`` (the one-line summary), ``DESCRIPTION`` (paragraphs split at blank
lines), optionally ``EPILOG``, ``add_arguments(parser)`` and ``run(args) -> exit status``. Its heavy imports
happen inside ``run``, so building the parser (``--help``) stays fast. Wiring into an argparse CLI::

    from primus_energon.datasets.commands import register
    register(commands)            # `commands` = parser.add_subparsers(...); each sets `handler`

Exit status: 0 clean, 1 problems found (or a cooker rejected a previewed sample), 2 refused (bad arguments,
nothing to validate).
"""

from __future__ import annotations

import argparse
from typing import Any

from . import finalize, info, preview, validate
from .common import wrap

__all__ = ["COMMANDS", "register"]

#: the command modules, in the order ``--help`` lists them
COMMANDS = (finalize, validate, info, preview)


def register(commands: Any) -> None:
    """Add every command of `COMMANDS` to an argparse subparsers object; each subparser sets ``handler``
    (its module's ``run``: a function of the parsed args returning the exit status)."""
    for command in COMMANDS:
        epilog = getattr(command, "EPILOG", None)
        parser = commands.add_parser(
            command.NAME,
            help=command.HELP,
            description=wrap(command.DESCRIPTION),
            epilog=wrap(epilog) if epilog is not None else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(parser)
        parser.set_defaults(handler=command.run)
