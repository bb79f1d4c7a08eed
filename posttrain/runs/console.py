"""The one console every command prints to (rich: colours, progress bars, tables)."""

from __future__ import annotations

from rich.console import Console

console = Console()
