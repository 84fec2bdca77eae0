"""The one exception type a user of the generator can provoke."""

from __future__ import annotations

__all__ = ["SyntheticError"]


class SyntheticError(ValueError):
    """A bad option, schema, fault spec or output directory.

    The message names what was wrong and what to do instead; the CLI prints it as one line and exits 2.
    """
