"""The service's runtime: loads the artifact and the model once (in the background), owns the scheduler.

Loading order: the artifact first (its files are hash-checked before `joblib.load`; it
tells how many attention lags to capture), then the model, then the model is checked
against the artifact. A missing artifact leaves TAD unavailable (baselines still work), unless
`TAD_REQUIRE_ARTIFACT` or a manifest pin asks for one; a corrupt or mismatched one, or a model that
fails to load, is fatal: the process exits non-zero with the reason.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import torch

from app.engine.engine import Engine
from app.engine.loading import ModelLoadError, load_model
from app.errors import NotReady
from app.serving.metrics import ServiceMetrics
from app.serving.policy import Policy, default_method, resolve_policy
from app.serving.scheduler import Scheduler
from app.settings import Settings
from app.uncertainty.answer import AnswerScorer
from app.uncertainty.artifact import MANIFEST_NAME, ArtifactError, TadArtifact, load_artifact
from app.uncertainty.features import DEFAULT_N_LAGS, Convention
from app.uncertainty.methods import Method

logger = logging.getLogger(__name__)


class State(StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    DRAINING = "draining"


class StartupError(RuntimeError):
    """Configuration, artifact or model problem that stops the service from starting."""


class ArtifactReloadError(RuntimeError):
    """A new artifact was refused; the one serving stays."""


@dataclass(frozen=True)
class ServingArtifact:
    """What one request uses from start to end: the artifact and the scorer built from it.

    A reload swaps the runtime's `ServingArtifact` in one assignment; a request reads it once,
    so a request in flight during a swap finishes with the artifact it started with.
    """

    artifact: TadArtifact | None
    scorer: AnswerScorer
    manifest_sha256: str | None = None
    loaded_at: float = 0.0

    @property
    def name(self) -> str:
        return self.artifact.name if self.artifact else "none"


class Runtime:
    def __init__(self, settings: Settings, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.state = State.LOADING
        self.started_at = time.time()
        self.failure: str | None = None
        self.engine: Engine | None = None
        self.serving = ServingArtifact(artifact=None, scorer=AnswerScorer(None))
        self.tad_unavailable_reason: str | None = None
        self.scheduler: Scheduler | None = None
        self.http_in_flight = 0
        self.load_seconds: float | None = None
        self._method_thresholds: tuple[ServingArtifact, dict[str, float | None]] | None = None
        self._lock = threading.Lock()
        self._reload_lock = threading.Lock()

    # ------------------------------------------------------------------ loading
    def start_loading(self, on_fatal: Callable[[str], None] | None = None) -> threading.Thread:
        def target() -> None:
            try:
                self.load()
            except Exception as error:  # every failure here is fatal and must be reported
                if isinstance(error, StartupError | ArtifactError | ModelLoadError):
                    reason = str(error)
                    logger.error("startup failed: %s", reason)
                else:  # unexpected: the details go to the log only
                    reason = f"unexpected {type(error).__name__} while loading; see the server log"
                    logger.exception("startup failed")
                self.failure = reason
                self.state = State.FAILED
                if on_fatal is not None:
                    on_fatal(reason)

        thread = threading.Thread(target=target, name="tad-loader", daemon=True)
        thread.start()
        return thread

    def load(self) -> None:
        started = time.monotonic()
        settings = self.settings
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        artifact = self._load_artifact()
        logger.info("loading model %s", settings.model)
        loaded = load_model(
            settings.model,
            device=settings.device,
            dtype=settings.dtype,
            cache_dir=settings.cache_dir,
            verify_sha256=settings.verify_model_sha256,
            artifact_dtype=artifact.manifest.dtype if artifact is not None else None,
        )
        if artifact is not None:
            artifact.check_model(loaded.identity)
            _warn_on_other_dtype(artifact, loaded.dtype_name)
        # Attention rows are captured with or without an artifact: RAUQ and Attention Score read them too.
        # Without one, the lags and convention `generate` defaults to, so that an artifact trained later
        # with the defaults can be hot-reloaded into this engine. The generating convention never reads
        # the last token's own step row: no extra step for it.
        n_lags = artifact.n_lags if artifact is not None else DEFAULT_N_LAGS
        last_row = artifact is not None and artifact.convention is Convention.CONSUMING
        self.engine = Engine(
            loaded, n_lags=n_lags, last_row=last_row, compiled_decode_length=settings.compiled_decode_length
        )
        if settings.compiled_decode_length:
            self.engine.warm_up_compiled_decode(settings.max_batch_size)
            if (refusal := self.engine.compiled_decode_refusal()) is not None:
                logger.warning("TAD_COMPILED_DECODE_LENGTH is set but the decode loop stays eager: %s", refusal)
        self.serving = self._serving(artifact)
        self._check_policy()
        self.scheduler = Scheduler(
            self.engine,
            self.scorer,
            max_batch_size=settings.max_batch_size,
            max_queue=settings.max_queue,
            batch_window_s=settings.batch_window_ms / 1000.0,
            on_batch=self.metrics.batch_size.observe,
            prefill_chunk_tokens=settings.prefill_chunk_tokens,
            broken_after_failed_steps=settings.broken_after_failed_steps,
        )
        # What loading left (the model's modules, the tokenizer, compiled code: hundreds of thousands of
        # objects) lives as long as the process: out of the cyclic collector's sight, whose full passes
        # over it stalled every answer in flight for a third of a second (docs/performance.md).
        gc.collect()
        gc.freeze()
        self.scheduler.start()
        self.load_seconds = round(time.monotonic() - started, 2)
        self._publish_artifact()
        with self._lock:
            if self.state is State.LOADING:  # a SIGTERM during the load leaves it DRAINING, and not ready
                self.state = State.READY
                self.metrics.ready.set(1)
        logger.info(
            "ready in %.1f s: model %s on %s in %s, TAD %s",
            self.load_seconds,
            loaded.identity.name,
            loaded.device,
            loaded.dtype_name,
            f"off ({self.tad_unavailable_reason})" if self.tad_unavailable_reason else "on",
        )

    def _load_artifact(self) -> TadArtifact | None:
        path = self.settings.artifact_dir
        if path is None:
            self.tad_unavailable_reason = "no artifact configured (TAD_ARTIFACT_DIR)"
        elif not (path / MANIFEST_NAME).is_file():
            self.tad_unavailable_reason = f"no artifact at {path}"
        else:
            artifact = load_artifact(path, manifest_sha256=self.settings.artifact_manifest_sha256)
            self.tad_unavailable_reason = _no_regressor(artifact)
            return artifact
        if self.settings.require_artifact:
            raise StartupError(f"TAD_REQUIRE_ARTIFACT is set but {self.tad_unavailable_reason}")
        if self.settings.artifact_manifest_sha256 is not None:  # a pinned artifact is required by the pin
            raise StartupError(f"TAD_ARTIFACT_MANIFEST_SHA256 pins an artifact but {self.tad_unavailable_reason}")
        logger.warning("TAD unavailable: %s; answering with baselines only", self.tad_unavailable_reason)
        return None

    def _check_policy(self) -> None:
        problem = self._policy_problem(self.artifact)
        if problem is not None:
            raise StartupError(problem)

    def _policy_problem(self, artifact: TadArtifact | None) -> str | None:
        """A configured target the artifact does not have is a configuration error. (A configured method that
        cannot score answers here is not: without a TAD regressor TAD gives way to the fallback policy.)"""
        target = self.settings.reject_target
        if artifact is None or target is None or self.settings.reject_threshold is not None:
            return None
        manifest = artifact.manifest
        method = default_method(self.settings, artifact)
        name = manifest.default_target if target == "default" else target
        if name is None or name in manifest.thresholds.get(method, {}):
            return None
        if target == "default":
            return (
                f"{artifact.path}: the default target {name} is not calibrated for {method.value}; "
                "run `python -m training calibrate` on the artifact"
            )
        return f"TAD_REJECT_TARGET={target} is not calibrated in {artifact.path} for {method.value}"

    # ------------------------------------------------------------------ artifact
    @property
    def artifact(self) -> TadArtifact | None:
        return self.serving.artifact

    @property
    def scorer(self) -> AnswerScorer:
        return self.serving.scorer

    @staticmethod
    def _serving(artifact: TadArtifact | None) -> ServingArtifact:
        # The hash of the bytes it was read from: a manifest replaced since is not what serves.
        digest = artifact.manifest_sha256 if artifact else None
        return ServingArtifact(
            artifact=artifact, scorer=AnswerScorer(artifact), manifest_sha256=digest, loaded_at=time.time()
        )

    def _publish_artifact(self) -> None:
        """The serving artifact in the info gauges (one series: the old one is removed); the rolling rejection
        rates start again on its thresholds."""
        assert self.engine is not None
        self.metrics.reset_rejection_windows()
        self.metrics.info.clear()
        self.metrics.info.labels(
            model=self.engine.identity.name, artifact=self.serving.name, device=str(self.engine.device)
        ).set(1)
        self.metrics.decision_method.clear()
        self.metrics.decision_method.labels(method=self.default_policy().method.value).set(1)
        self.metrics.artifact.clear()
        self.metrics.artifact.labels(
            artifact=self.serving.name, manifest_sha256=self.serving.manifest_sha256 or "none"
        ).set(self.serving.loaded_at)

    def reload_artifact(self) -> ServingArtifact:
        """Load the artifact at TAD_ARTIFACT_DIR again and serve it from the next request on.

        Everything is checked before the swap (file hashes before unpickling, the pinned
        manifest hash, the model, the features the running engine captures); on any failure
        the artifact serving now stays and the reason is raised. Requests in flight keep the
        artifact they started with.
        """
        with self._reload_lock:
            try:
                engine, _ = self.require_ready()
                path = self.settings.artifact_dir
                if path is None:
                    raise ArtifactReloadError("TAD_ARTIFACT_DIR is not set: there is no artifact to reload")
                if not (path / MANIFEST_NAME).is_file():
                    raise ArtifactReloadError(f"no artifact at {path}")
                try:
                    artifact = load_artifact(path, manifest_sha256=self.settings.artifact_manifest_sha256)
                    artifact.check_model(engine.identity)
                except ArtifactError as error:
                    raise ArtifactReloadError(str(error)) from error
                self._check_capture(artifact, engine)
                problem = self._policy_problem(artifact)
                if problem is not None:
                    raise ArtifactReloadError(problem)
                serving = self._serving(artifact)
            except (ArtifactReloadError, NotReady) as error:
                self._refuse_reload(error)
                raise ArtifactReloadError(str(error)) from error
            except Exception as error:  # e.g. a regressor pickled by another scikit-learn, a file vanishing
                logger.exception("loading the artifact failed")
                refusal = ArtifactReloadError("the artifact could not be loaded; the server log says why")
                self._refuse_reload(refusal)
                raise refusal from error
            self.serving = serving
            self.tad_unavailable_reason = _no_regressor(serving.artifact)
            self._publish_artifact()
            self.metrics.artifact_reloads.labels(outcome="loaded").inc()
            logger.info("artifact reloaded: %s (manifest %s)", serving.name, (serving.manifest_sha256 or "")[:16])
            return serving

    def _refuse_reload(self, error: Exception) -> None:
        self.metrics.artifact_reloads.labels(outcome="refused").inc()
        logger.error("artifact reload refused, %s keeps serving: %s", self.serving.name, error)

    def _check_capture(self, artifact: TadArtifact, engine: Engine) -> None:
        """The running engine must capture what the new artifact reads; otherwise it needs a restart."""
        if artifact.manifest.dtype != engine.loaded.dtype_name and self.settings.dtype == "auto":
            raise ArtifactReloadError(
                f"artifact {artifact.path} was trained on answers generated in {artifact.manifest.dtype}, the "
                f"running model computes in {engine.loaded.dtype_name}: restart the service to switch"
            )
        if artifact.n_lags != engine.n_lags:
            raise ArtifactReloadError(
                f"artifact {artifact.path} reads {artifact.n_lags} lags, the running engine captures "
                f"{engine.n_lags}: restart the service to change them"
            )
        if artifact.convention is Convention.CONSUMING and not engine.context.last_row:
            raise ArtifactReloadError(
                f"artifact {artifact.path} uses the consuming convention, which needs the last token's own "
                "step row that the running engine skips: restart the service to switch conventions"
            )

    # ------------------------------------------------------------------ serving
    @property
    def model_name(self) -> str:
        """The name clients see (and must send to the OpenAI routes)."""
        if self.settings.served_model_name:
            return self.settings.served_model_name
        return self.engine.identity.name if self.engine else self.settings.model

    def serves(self, name: str) -> bool:
        """Whether a request's `model` names this server's model: the name it serves under, or, when no
        served name is configured, also the model spec it was started with (`TAD_MODEL=qwen2.5-coder-1.5b`),
        which is what someone who typed that spec sends, as vLLM serves a model under the name it was given."""
        if name == self.model_name:
            return True
        return not self.settings.served_model_name and name == self.settings.model

    def require_ready(self) -> tuple[Engine, Scheduler]:
        if self.state is State.DRAINING:
            raise NotReady("the service is shutting down", retry_after_s=10)
        if self.state is State.FAILED:
            raise NotReady("the service failed to start; see its log", retry_after_s=60)
        if self.state is not State.READY or self.engine is None or self.scheduler is None:
            raise NotReady("the model is still loading", retry_after_s=5)
        if (problem := self._worker_problem(self.scheduler)) is not None:
            # Accepted, a request would only wait for its deadline or fail: refuse it, and let /ready and
            # tad_ready take this replica out of rotation.
            self.metrics.ready.set(0)
            raise NotReady(f"{problem}; see the log", retry_after_s=60)
        return self.engine, self.scheduler

    def _worker_problem(self, scheduler: Scheduler) -> str | None:
        """Why the worker cannot answer any more (only a restart mends it), or None."""
        if not scheduler.alive:
            return "the generation worker has stopped"
        if (broken := scheduler.failures.broken) is not None:
            return f"the last {broken} steps all failed"
        # One pass longer than a request may last: a forward that never returns (a hung device, a deadlock).
        if (running_s := scheduler.pass_running_s) > self.settings.request_timeout_s:
            return f"the generation worker has been in one pass of model steps for {running_s:.0f} s"
        return None

    def refresh_ready_gauge(self) -> None:
        """tad_ready from the state now: a replica whose failing steps stopped (one succeeded) is back."""
        serving = self.state is State.READY and self.scheduler is not None and self.needs_restart is None
        self.metrics.ready.set(1 if serving else 0)

    @property
    def needs_restart(self) -> str | None:
        """Why only a restart can bring this replica back (what liveness reports), or None."""
        if self.state is not State.READY or self.scheduler is None:
            return None  # loading, draining or failed at startup: readiness says so, and none of them hangs
        return self._worker_problem(self.scheduler)

    def default_policy(self) -> Policy:
        return resolve_policy(self.settings, self.artifact, None)

    def method_thresholds(self) -> dict[str, float | None]:
        """Each method's threshold for the rolling would-reject gauges, computed once per serving artifact: a
        reload on its thread may swap the artifact while the event loop computes them from the old one."""
        serving = self.serving
        cached = self._method_thresholds
        if cached is None or cached[0] is not serving:
            thresholds: dict[str, float | None] = {m.value: None for m in Method}
            if serving.artifact is not None:
                manifest = serving.artifact.manifest
                target = self.settings.reject_target
                name = manifest.default_target if target in (None, "default") else target
                for method in Method:
                    entry = manifest.thresholds.get(method, {}).get(name or "")
                    thresholds[method.value] = entry.threshold if entry else None
            policy = resolve_policy(self.settings, serving.artifact, None)
            thresholds[policy.method.value] = policy.threshold
            cached = self._method_thresholds = (serving, thresholds)
        return cached[1]

    def begin_draining(self) -> None:
        with self._lock:
            self.state = State.DRAINING
        self.metrics.ready.set(0)

    def track_http(self, delta: int) -> None:
        with self._lock:
            self.http_in_flight += delta

    def shutdown(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()


def _no_regressor(artifact: TadArtifact | None) -> str | None:
    """Why an artifact that is loaded gives no TAD score, or None where it does."""
    if artifact is None or artifact.has_regressor:
        return None
    return f"artifact {artifact.name} is calibration-only (it has no TAD regressor)"


def _warn_on_other_dtype(artifact: TadArtifact, dtype: str) -> None:
    """A dtype set by hand may differ from the artifact's: its scores then drift by that dtype's rounding."""
    if artifact.manifest.dtype != dtype:
        logger.warning(
            "the model runs in %s but artifact %s was trained on answers generated in %s: TAD scores will differ "
            "slightly from those it was calibrated on (TAD_DTYPE=auto follows the artifact)",
            dtype,
            artifact.name,
            artifact.manifest.dtype,
        )
