"""A second C++ reference on every tensor compiled code reads, so that releasing one never needs the GIL.

Inductor's C++ wrapper releases the GIL while its program runs and frees its handle on each input
once the input's last use has passed. In torch 2.13, when that handle is a tensor's only C++
reference besides its Python object's, freeing it drops the Python object's reference, which takes
the GIL back (`c10::TensorImpl::decref_pyobject`): the worker then waits, once per weight, for the
event loop's thread to give the GIL up. A TorchScript list of the tensors holds a C++ reference on
each, so while it lives no handle is ever the last one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def tensors_of(module: torch.nn.Module) -> list[torch.Tensor]:
    """A module's parameters and buffers, and the tensors its submodules keep as plain attributes
    (a rotary embedding's `original_inv_freq`): what compiled code lifts from the model as inputs."""
    found = [*module.parameters(), *module.buffers()]
    for submodule in module.modules():
        found.extend(value for value in vars(submodule).values() if isinstance(value, torch.Tensor))
    return found


def tensors_in(root: object, depth: int = 4) -> list[torch.Tensor]:
    """The tensors reachable from `root` through attributes, lists, tuples and dicts, `depth` levels deep
    (a module's: `tensors_of`)."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()

    def visit(value: Any, left: int) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, torch.nn.Module):
            found.extend(tensors_of(value))
        elif left > 0:
            children: Iterable[Any]
            if isinstance(value, list | tuple | set):
                children = value
            elif isinstance(value, dict):
                children = value.values()
            elif hasattr(value, "__dict__") and not callable(value):
                children = vars(value).values()
            else:
                return
            for child in children:
                visit(child, left - 1)

    visit(root, depth)
    return found


def hold(tensors: Iterable[torch.Tensor]) -> object:
    """A C++ reference on each tensor, for as long as the returned object lives."""
    tensors = list(tensors)
    return torch.ScriptList(tensors) if tensors else None
