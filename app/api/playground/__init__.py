"""The playground page: its routes, and its static files (HTML, ES modules, CSS) shipped as package data."""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"
