"""The runtime: which names a request's `model` may use; what loading leaves behind; the drift gauges'
thresholds."""

from __future__ import annotations

import gc
from pathlib import Path

from app.engine.engine import Engine
from app.serving.metrics import ServiceMetrics
from app.serving.runtime import Runtime
from app.settings import Settings
from app.uncertainty.artifact import load_artifact
from tests.app.service_client import make_client


def _runtime(engine: Engine, **settings: object) -> Runtime:
    runtime = Runtime(Settings(artifact_dir="", **settings), ServiceMetrics())
    runtime.engine = engine
    return runtime


def test_the_served_name_and_the_spec_it_was_started_with_both_name_the_model(engine: Engine) -> None:
    runtime = _runtime(engine, model="smollm2-135m")
    assert runtime.model_name == engine.identity.name != "smollm2-135m"
    assert runtime.serves(engine.identity.name)
    assert runtime.serves("smollm2-135m")
    assert not runtime.serves("gemma3-270m")
    assert not runtime.serves("")


def test_a_configured_served_name_is_the_only_name(engine: Engine) -> None:
    runtime = _runtime(engine, model="smollm2-135m", served_model_name="team-llm")
    assert runtime.model_name == "team-llm"
    assert runtime.serves("team-llm")
    assert not runtime.serves("smollm2-135m")
    assert not runtime.serves(engine.identity.name)


def test_what_loading_left_is_out_of_the_cyclic_collector_s_sight(service_settings: Settings) -> None:
    """A full collection walking the model, tokenizer and compiled code stalled every answer in flight for a
    third of a second on the tiny benchmark model (docs/performance.md, Serving speed)."""
    gc.unfreeze()
    with make_client(service_settings):
        assert gc.get_freeze_count() > 0


def test_the_drift_thresholds_follow_the_serving_artifact_swapped_in(engine: Engine, tiny_artifact: Path) -> None:
    """A reload swaps `serving` on its own thread: thresholds the event loop computed from the artifact before
    must not stay cached for the one after (they were reset by the reload, and a computation of the old ones
    still running on the loop could store them after the reset)."""
    runtime = _runtime(engine)
    without = runtime.method_thresholds()
    assert without["tad"] is None
    runtime.serving = Runtime._serving(load_artifact(tiny_artifact))  # the swap alone, as a reload makes it
    with_artifact = runtime.method_thresholds()
    assert with_artifact["tad"] is not None and with_artifact != without
    assert runtime.method_thresholds() is with_artifact  # computed once per serving artifact
