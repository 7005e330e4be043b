"""The playground page's static files (HTML, ES modules, CSS), shipped as package data; no build step."""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"
