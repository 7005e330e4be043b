"""The import graph of app/ and training/ goes down the layers only, and has no cycle.

Every import counts, those inside functions and under TYPE_CHECKING included: a lazy import
that climbs back up is still a dependency of the lower layer on the higher one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Top to bottom: a module may import from its own layer or any layer below it. A module belongs to
# the layer of the longest prefix that names it ("app" alone is the package's __init__).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("training.__main__",),
    ("training.cli",),
    ("training.commands",),
    ("training",),
    ("app.__main__", "app.main"),
    ("app.api",),
    ("app.serving",),
    ("app.engine",),
    ("app.settings",),
    ("app.uncertainty",),
    ("app", "app.errors", "app.hashing", "app.identity", "app.numeric"),
)


def _modules() -> dict[str, Path]:
    found = {}
    for package in ("app", "training"):
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


MODULES = _modules()


def _imported(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _edges() -> dict[str, set[str]]:
    return {
        name: {target for target in _imported(path) if target in MODULES and target != name}
        for name, path in MODULES.items()
    }


def layer_of(module: str) -> int:
    matches = [
        (len(prefix), index)
        for index, prefixes in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    if not matches:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return max(matches)[1]


def test_every_import_goes_down_or_across_a_layer() -> None:
    upward = [
        f"{source} -> {target}"
        for source, targets in _edges().items()
        for target in sorted(targets)
        if layer_of(target) < layer_of(source)
    ]
    assert upward == []


def test_the_module_graph_has_no_cycle() -> None:
    edges = _edges()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert cycles == []


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [("app.api.common", "app.serving.runtime", True), ("app.serving.runtime", "app.api.common", False)],
)
def test_the_layer_order_is_what_it_says(source: str, target: str, allowed: bool) -> None:
    assert (layer_of(target) >= layer_of(source)) is allowed


WEB_FRAMEWORKS = ("fastapi", "starlette", "uvicorn")


def test_below_the_api_nothing_imports_the_web_framework() -> None:
    """Serving, the engine and the uncertainty methods run the same without HTTP (training and benchmarks
    call them in-process): the API layer alone knows FastAPI."""
    api = layer_of("app.api")
    web = [
        f"{name} -> {target}"
        for name, path in MODULES.items()
        if name.startswith("app.") and layer_of(name) > api
        for target in _imported(path)
        if target.split(".")[0] in WEB_FRAMEWORKS
    ]
    assert web == []
