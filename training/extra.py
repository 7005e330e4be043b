"""The training extra (pyproject's `[project.optional-dependencies] train`): checked when a command starts.

`make install` installs what the server needs and not this; a training command run on that install used to
fail when it first reached a module of the extra, after minutes of work (generate died at TruthfulQA, the
first task scored with ROUGE, after 900 answers). Checked before anything loads, the missing extra is one
line naming the install command.
"""

from __future__ import annotations

import importlib.util

# Distribution (as pyproject names it) -> the module it provides; a test checks the list against pyproject.
TRAIN_EXTRA = {"matplotlib": "matplotlib", "rouge-score": "rouge_score", "scipy": "scipy"}  # tqdm: a runtime dependency
INSTALL_HINT = 'run `make install-dev` (or `pip install -e ".[train]"`)'
EXIT_STATUS = 2


def missing_modules() -> list[str]:
    """The extra's modules that cannot be imported here. Found, not imported: importing matplotlib and scipy
    costs every command a second, and what is installed but broken fails where it is used."""
    missing = []
    for module in TRAIN_EXTRA.values():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a finder that refuses the module; a module without a spec
            found = False
        if not found:
            missing.append(module)
    return missing


def missing_extra_message() -> str | None:
    """One line saying what is missing and how to install it, or None when the extra is there."""
    missing = missing_modules()
    if not missing:
        return None
    return f"error: the training extra is not installed (no module {', '.join(missing)}): {INSTALL_HINT}"
