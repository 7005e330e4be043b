"""`python -m training <command>`: generate, fit, evaluate, calibrate, calibration-artifact, lodo, summary
(each has --help)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from types import FrameType, ModuleType
from typing import NoReturn

from training.arguments import UsageError
from training.commands import calibrate, calibration_artifact, evaluate, fit, generate, lodo, summary
from training.extra import EXIT_STATUS, missing_extra_message

# Each command module registers its parser (`register(subparsers)`), runs (`run(args)`) and says what an
# interruption leaves (`INTERRUPTED`); in this order in --help.
COMMANDS: dict[str, ModuleType] = {
    module.NAME: module for module in (generate, fit, evaluate, calibrate, calibration_artifact, lodo, summary)
}
INTERRUPTED = {name: module.INTERRUPTED for name, module in COMMANDS.items()}


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    subparsers = parser.add_subparsers(dest="command", required=True)
    return parser, {name: module.register(subparsers) for name, module in COMMANDS.items()}


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, a batch scheduler, `kill`), ended as Ctrl-C is: the same message, exit status 143."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def build_parser() -> argparse.ArgumentParser:
    return _build()[0]


def main(argv: list[str] | None = None) -> None:
    """Run a command; a user's mistake (a missing file, a bad model or artifact, a corrupt run) ends it with
    one line on stderr and exit status 1, Ctrl-C with 130 (SIGTERM 143), instead of a traceback. Without the training
    extra a command ends at once (exit status 2) with one line saying how to install it; --help works."""
    parser, commands = _build()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    missing = missing_extra_message()
    if missing is not None:
        print(missing, file=sys.stderr)
        raise SystemExit(EXIT_STATUS)
    # Signal handlers can only be set from the main thread (a caller running main() elsewhere keeps its own).
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        _run(args, commands[args.command])
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    try:
        # Seconds of imports (torch, transformers): a Ctrl-C meanwhile is answered like one during the work.
        from app.engine.loading import ModelLoadError
        from app.uncertainty.artifact import ArtifactError
    except KeyboardInterrupt as interruption:
        _interrupted(args.command, interruption)
    try:
        COMMANDS[args.command].run(args)
    except UsageError as error:
        parser.error(str(error))
    except KeyboardInterrupt as interruption:
        _interrupted(args.command, interruption)
    except (OSError, ModelLoadError, ArtifactError, json.JSONDecodeError) as error:
        if args.verbose:  # the traceback is what a bug report needs
            raise
        print(f"error: {_describe(error)}", file=sys.stderr)
        raise SystemExit(1) from None


def _interrupted(command: str, interruption: KeyboardInterrupt) -> NoReturn:
    """Say what a rerun of `command` does, and exit 130 (Ctrl-C) or 143 (SIGTERM)."""
    print(f"\ninterrupted: {INTERRUPTED[command]}", file=sys.stderr)
    raise SystemExit(143 if isinstance(interruption, Terminated) else 130) from None


def _describe(error: BaseException) -> str:
    """One line for an error a user can fix."""
    if isinstance(error, json.JSONDecodeError):
        # The decoder does not know the file; the runs' own reader names it (training/runs.py).
        return f"a JSON file is corrupt ({error.msg} at line {error.lineno} column {error.colno})"
    if isinstance(error, OSError) and error.filename is not None:
        return f"{error.strerror or type(error).__name__}: {error.filename}"
    return str(error) or type(error).__name__
