"""What the admin verbs share (`homing.admin.commands`, `homing.admin.rollout_commands`):
exit statuses, the verb signature, a proto message as JSON-ready data, and where output goes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.message import Message

#: Exit statuses: done; refused (the server said no, or a wait timed out); usage (argparse);
#: unreachable (no socket, nothing answering).
EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

#: One verb: called with the admin client, the parsed arguments and the output; the exit status.
Verb = Callable[[Any, argparse.Namespace, "Output"], Awaitable[int]]
#: Makes one verb's parser with the common admin options: (sub-commands, name, verb, help).
VerbMaker = Callable[
    ["argparse._SubParsersAction[argparse.ArgumentParser]", str, Verb, str],
    argparse.ArgumentParser,
]


def message_dict(message: Message) -> dict[str, Any]:
    """`message` as JSON-ready data under its proto field names: every field present,
    unset optional scalars as None, 64-bit integers as numbers (protobuf's own JSON mapping
    would write them as strings)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        is_message = field.type == field.TYPE_MESSAGE
        if field.is_repeated:
            out[field.name] = [message_dict(v) if is_message else v for v in value]
        elif is_message:
            out[field.name] = message_dict(value)
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = value
    return out


class Output:
    """Where a verb's result goes: JSON or rich tables on stdout."""

    def __init__(self, mode: str) -> None:
        from rich.console import Console

        self.mode = mode
        console = Console()
        # Not a terminal (a pipe, a file): wide enough that tables are not wrapped to 80.
        self.console = console if console.is_terminal else Console(width=200)

    def json(self, data: Any) -> None:
        """Print `data` as indented JSON."""
        print(json.dumps(data, indent=2))

    def line(self, text: str) -> None:
        """Print `text` as it is: one line, never wrapped, no markup read from it."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def table(self, headers: list[str], rows: list[list[str]], title: str | None = None) -> None:
        """Print a table of `rows` under `headers`."""
        from rich.table import Table

        # Plain columns, as kubectl and docker print them: easy to read and to grep.
        table = Table(*headers, title=title, box=None, pad_edge=False, title_justify="left")
        for row in rows:
            table.add_row(*row)
        self.console.print(table)
