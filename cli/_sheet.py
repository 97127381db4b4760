"""How a command's rows reach the operator: a table that fits the terminal, or TSV in a pipe.

A `Sheet` is a titled list of rows with named columns and at most one `note` column (the
long free text: why a topic is not purged, a procedure's error). `Output.show` prints it:

- stdout is a terminal: the first layout whose width fits the console, tried in order:
  one table with the note as its last column; the table without the note, each row's note
  on a line of its own below it (keyed by the row's first cell); the same with two-line
  headers; without the columns marked `optional`; finally one block per row. Numbers and
  names never wrap inside a cell, and a note wraps at the console width, never word by
  word in a narrow column. Topic names that share a long prefix are shown with the prefix
  elided (`…_3`), the elided prefix named in the title, the same way in every table.
- stdout is not a terminal: tab-separated values, one header line of `Column.key`s, one
  line per row, the same number of fields on every line; full names, empty for a missing
  value. Only the command's main sheet is printed, so `cut`/`awk` see one table.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

Cell = str | int | float | None

_SEPARATORS = "_-."
_MIN_ELIDED = 6
"""Shortest prefix worth eliding (characters)."""
_ELLIPSIS = "…"


@dataclasses.dataclass(frozen=True, slots=True)
class Column:
    """One column of a sheet."""

    title: str
    """Header in a terminal table."""
    key: str
    """Header in TSV (snake_case, as the JSON field where there is one)."""
    numeric: bool = False
    """Right-aligned in a terminal table."""
    topic: bool = False
    """Holds topic names (elided like every other topic column)."""
    optional: bool = False
    """Left out in a terminal too narrow for it (still in TSV and JSON)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One row: a cell per column, the note, and a terminal style for the whole row."""

    cells: tuple[Cell, ...]
    note: str = ""
    style: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Sheet:
    """A titled table: `columns`, `rows`, and the free-text column `note` (if any)."""

    title: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    note: Column | None = None
    empty: str = ""
    """Printed in a terminal instead of a table without rows."""

    def topics(self) -> set[str]:
        """Topic names in this sheet's topic columns."""
        found: set[str] = set()
        for i, column in enumerate(self.columns):
            if column.topic:
                found.update(str(r.cells[i]) for r in self.rows if r.cells[i] is not None)
        return found


# --- topic names ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class TopicNames:
    """Shows topic names with their common prefix elided, or unchanged when there is none."""

    prefix: str = ""
    """Elided from every name that starts with it ("" elides nothing)."""

    @classmethod
    def of(cls, names: Iterable[str]) -> TopicNames:
        """The prefix shared by all `names` up to their last common separator (`_`, `-`,
        `.`), so what stays starts at a separator (`greptimedb_wal_topic_3` -> `…_3`, also
        for a single name); none when it would be under six characters."""
        distinct = sorted(set(names))
        if not distinct:
            return cls()
        # Sorted: what the first and last name share, every name shares.
        first, last = distinct[0], distinct[-1]
        n = 0
        while n < min(len(first), len(last)) and first[n] == last[n]:
            n += 1
        common = first[:n]
        cut = max(common.rfind(sep) for sep in _SEPARATORS)
        prefix = common[:cut] if cut > 0 else ""
        return cls(prefix if len(prefix) >= _MIN_ELIDED else "")

    def show(self, name: str) -> str:
        if self.prefix and name.startswith(self.prefix):
            return _ELLIPSIS + name[len(self.prefix) :]
        return name

    def legend(self) -> str:
        """What the ellipsis stands for, for a title."""
        return f"{_ELLIPSIS} = {self.prefix}" if self.prefix else ""


# --- output -----------------------------------------------------------------------------------


def _text(value: Cell) -> str:
    return "-" if value is None else str(value)


def _tsv(value: Cell) -> str:
    if value is None:
        return ""
    return " ".join(str(value).split("\t")).replace("\r", " ").replace("\n", " ")


class Output:
    """Where a command prints: a terminal (tables that fit) or a pipe (TSV)."""

    def __init__(self, *, terminal: bool | None = None) -> None:
        self.terminal = sys.stdout.isatty() if terminal is None else terminal
        # Created per command, so COLUMNS and the terminal's size are read when it runs. A
        # terminal gets every line wrapped at its width; a pipe gets lines whole.
        self.console = Console(highlight=False, soft_wrap=not self.terminal)

    def json(self, value: Any) -> None:
        """`value` (already the server's JSON, parsed) as indented JSON."""
        sys.stdout.write(json.dumps(value, indent=2) + "\n")

    def emit(self, as_json: bool, body: Any, main: Sheet, *extras: Sheet | str) -> None:
        """`body` (the server's JSON) with `--json`, else `show(main, *extras)`."""
        if as_json:
            self.json(body)
        else:
            self.show(main, *extras)

    def show(self, main: Sheet, *extras: Sheet | str, lead: str = "") -> None:
        """`main` as TSV in a pipe; in a terminal `lead`, `main`, then `extras` (empty
        strings and empty sheets without an `empty` message skipped), every topic name
        elided the same way."""
        if not self.terminal:
            self.tsv(main)
            return
        sheets = [main, *(e for e in extras if isinstance(e, Sheet))]
        names = TopicNames.of(n for s in sheets for n in s.topics())
        first = True
        for item in (lead, main, *extras):
            shown = item.rows or item.empty if isinstance(item, Sheet) else item
            if not shown:
                continue
            if not first and isinstance(item, Sheet):
                self.console.print()
            first = False
            if isinstance(item, Sheet):
                self._table(item, names)
            else:
                self.console.print(item, markup=False)

    def line(self, text: str) -> None:
        """A one-line message (terminal and pipe alike)."""
        self.console.print(text, markup=False)

    def tsv(self, sheet: Sheet) -> None:
        columns = [*sheet.columns, *([sheet.note] if sheet.note else [])]
        lines = ["\t".join(c.key for c in columns)]
        for row in sheet.rows:
            cells = [*row.cells, *([row.note] if sheet.note else [])]
            lines.append("\t".join(_tsv(c) for c in cells))
        sys.stdout.write("\n".join(lines) + "\n")

    # --- terminal layouts ---

    def _table(self, sheet: Sheet, names: TopicNames) -> None:
        title = sheet.title
        if names.prefix and any(n.startswith(names.prefix) for n in sheet.topics()):
            title = f"{title} ({names.legend()})"
        if not sheet.rows:
            if sheet.empty:
                self.console.print(sheet.empty, markup=False)
            return
        width = self.console.width
        wide = self.console.options.update_width(10_000)
        required = [c for c in sheet.columns if not c.optional]
        layouts: list[tuple[Sequence[Column], bool, bool]] = [
            (sheet.columns, True, False),
            (sheet.columns, False, False),
            (sheet.columns, False, True),
            (required, False, True),
        ]
        for columns, inline_note, two_line in layouts:
            table = _grid(sheet, names, title, columns, inline_note, two_line)
            if self.console.measure(table, options=wide).maximum <= width:
                self.console.print(table)
                if not inline_note:
                    self._notes(sheet, names, columns)
                return
        self._blocks(sheet, names, title)

    def _notes(self, sheet: Sheet, names: TopicNames, columns: Sequence[Column]) -> None:
        """Each row's note after the row's key (its first cell): beside it when the keys
        are short, else on the lines below it, indented."""
        if sheet.note is None or not any(r.note for r in sheet.rows):
            return
        key = sheet.columns[0]
        keyed = [(_show(key, r.cells[0], names), r) for r in sheet.rows if r.note]
        self.console.print(Text(f"{sheet.note.title}:", style="bold"))
        if max(cell_len(k) for k, _ in keyed) > self.console.width // 4:
            for shown, row in keyed:
                self.console.print(Text(shown))
                note = Padding(Text(row.note, style=row.style or ""), (0, 0, 0, 2))
                self.console.print(note)
            return
        notes = Table(box=None, pad_edge=False, show_header=False, padding=(0, 1))
        notes.add_column(no_wrap=True)
        notes.add_column(overflow="fold")
        for shown, row in keyed:
            notes.add_row(Text(shown), Text(row.note, style=row.style or ""))
        self.console.print(notes)

    def _blocks(self, sheet: Sheet, names: TopicNames, title: str) -> None:
        """One block per row: its key, then `title value` pairs packed into lines, the note."""
        width = max(self.console.width, 20)
        self.console.print(Text(title, style="bold"))
        for row in sheet.rows:
            self.console.print(
                Text(_show(sheet.columns[0], row.cells[0], names), style=row.style or "bold")
            )
            line = ""
            for column, value in zip(sheet.columns[1:], row.cells[1:], strict=True):
                pair = f"{column.title} {_show(column, value, names)}"
                if line and len(line) + 2 + len(pair) > width:
                    self.console.print(line, markup=False)
                    line = ""
                line = f"{line}  {pair}" if line else f"  {pair}"
            if line:
                self.console.print(line, markup=False)
            if row.note:
                note = Padding(Text(row.note, style=row.style or ""), (0, 0, 0, 2))
                self.console.print(note)


def _show(column: Column, value: Cell, names: TopicNames) -> str:
    if column.topic and value is not None:
        return names.show(str(value))
    return _text(value)


def _grid(
    sheet: Sheet,
    names: TopicNames,
    title: str,
    columns: Sequence[Column],
    inline_note: bool,
    two_line: bool,
) -> Table:
    table = Table(
        title=Text(title),
        title_justify="left",
        title_style="bold",
        box=None,
        pad_edge=False,
        header_style="bold",
        padding=(0, 1),
    )
    for column in columns:
        header = column.title.replace(" ", "\n") if two_line else column.title
        table.add_column(header, justify="right" if column.numeric else "left", no_wrap=True)
    if inline_note and sheet.note is not None:
        table.add_column(sheet.note.title, no_wrap=True)
    index = [sheet.columns.index(c) for c in columns]
    for row in sheet.rows:
        cells: list[RenderableType] = [
            Text(_show(sheet.columns[i], row.cells[i], names)) for i in index
        ]
        if inline_note and sheet.note is not None:
            cells.append(Text(row.note))
        table.add_row(*cells, style=row.style or None)
    return table
