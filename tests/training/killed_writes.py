"""A write that a kill interrupts, for tests of what a killed command leaves behind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

Write = Callable[[Path, str], None]


def killed_writing(name: str, write: Write) -> Write:
    """`write`, except that writing a file called `name` is a Ctrl-C: the command killed just then."""

    def write_or_die(path: Path, text: str) -> None:
        if path.name == name:
            raise KeyboardInterrupt
        write(path, text)

    return write_or_die
