from __future__ import annotations

from typing import Any

from training.groups import TargetCentring
from training.two_stage import Variant

# A fit of one configuration with nothing tried beyond it: seconds on the tiny runs.
QUICK_FIT: dict[str, Any] = {
    "alphas": (1.0,),
    "variants": (Variant.LEAK_FREE,),
    "centrings": (TargetCentring.NONE,),
}
