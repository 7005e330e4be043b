"""The runtime: which names a request's `model` may use; what loading leaves behind."""

from __future__ import annotations

import gc

from app.engine.engine import Engine
from app.serving.metrics import ServiceMetrics
from app.serving.runtime import Runtime
from app.settings import Settings
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
