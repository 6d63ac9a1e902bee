"""A rich Table that shows its strings as they are.

Why: rich reads every str cell, column header and title as console markup. Status cells hold text from outside
our control (a worker's id, an actor's error message, a checkpoint path): "[/x]" in one of them took `league
status` and the live table of `league run` down with a MarkupError, "[bold]" vanished and styled the rest of
the cell, and "mcts:100:" could turn into an emoji.
"""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text


def plain(value: RenderableType | None) -> RenderableType | None:
    """`value` as literal text when it is a str; other renderables (and None) as they are."""
    return Text(value) if isinstance(value, str) else value


class PlainTable(Table):
    """rich.table.Table with its title, caption, column headers and cells taken literally."""

    def __init__(self, *headers: Any, title: RenderableType | None = None, caption: RenderableType | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*(plain(h) for h in headers), title=plain(title), caption=plain(caption), **kwargs)

    def add_column(self, header: RenderableType = "", *args: Any, **kwargs: Any) -> None:
        super().add_column(plain(header), *args, **kwargs)

    def add_row(self, *renderables: RenderableType | None, **kwargs: Any) -> None:
        super().add_row(*(plain(r) for r in renderables), **kwargs)
