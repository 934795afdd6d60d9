"""The pool review's parts: a section is data, its tables for the text output and its part of
the HTML page; :class:`TableSection` is the common one that is only tables."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class SectionTable:
    """A table of a review section, with lines printed under it."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TableSection:
    """A review section that is only tables: its HTML is the tables under a heading."""

    key: str
    title: str
    data: dict[str, Any]
    table_list: list[SectionTable]

    def to_json(self) -> dict[str, Any]:
        """Its plain data."""
        return self.data

    def tables(self) -> list[SectionTable]:
        """Its tables."""
        return self.table_list

    def html(self) -> str:
        """A heading, then each table (``none`` when empty) with its notes."""
        parts = [f"<h2>{html.escape(self.title)}</h2>"]
        for table in self.table_list:
            parts.append(f"<h3>{html.escape(table.title)}</h3>")
            parts.append(table_html(table.headers, table.rows) if table.rows else "<p>none</p>")
            parts.extend(f"<p>{html.escape(note)}</p>" for note in table.notes)
        return "\n".join(parts)


class ReviewSection(Protocol):
    """A part of the review built by another module (quotas and queues, ...), added to
    :attr:`Review.sections`: it appears under ``key`` in ``--json``, as tables after the tier
    table in the text output, and before the details in the HTML page."""

    @property
    def key(self) -> str:
        """Its key in ``--json``."""
        ...

    def to_json(self) -> dict[str, Any]:
        """Its plain data."""
        ...

    def tables(self) -> list[SectionTable]:
        """Its tables for the text output."""
        ...

    def html(self) -> str:
        """Its part of the page (self-contained: no scripts, no external resources)."""
        ...


def table_html(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
