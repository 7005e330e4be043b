"""TAD artifacts: a folder with `manifest.json` and the joblib regressor.

The manifest names the LLM the regressor was trained for (weights sha256 and attention
shape), the feature spec, aggregation, variant, calibrated thresholds, metrics, and the
sha256 of every other file. Loading checks those hashes *before* `joblib.load` (which
unpickles, so it must only ever see the bytes the manifest vouches for), then the
feature spec against the regressor, then the LLM against the loaded model.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Final, Literal

import joblib
import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from app.errors import validation_message
from app.files import write_text_atomic
from app.hashing import file_sha256
from app.identity import ModelIdentity
from app.uncertainty.aggregation import Aggregation
from app.uncertainty.features import FEATURE_ORDER, Convention, FeatureSpec
from app.uncertainty.methods import REGISTRY, Method
from app.uncertainty.tad import TadScorer

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION: Final = 1


class ArtifactError(RuntimeError):
    """The artifact is missing, corrupt, or does not belong to the loaded model."""


# What a manifest records of a `FeatureSpec` and reads back into one (the sizes are checked, not read).
_SPEC_FIELDS = ("n_lags", "num_layers", "num_heads", "order", "convention")


class FeatureInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order: str
    n_lags: int = Field(ge=1)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    # Artifacts from before the field existed were all trained with the consuming convention.
    convention: Convention = Convention.CONSUMING
    stage1_size: int
    stage2_size: int

    @model_validator(mode="before")
    @classmethod
    def _no_unadopted_features(cls, data: Any) -> Any:
        """Features that studies added and that were not adopted: per-token statistics after p_i
        (`extra_stats`), and the authors' p_i * c_{i-l} terms (`products`). Manifests written before their
        removal carry them empty and false: read as if absent. An artifact fitted with either is refused,
        since this code would score it on other features than it was fitted on."""
        if not isinstance(data, dict):
            return data
        if names := data.get("extra_stats"):
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise ValueError(
                f"the artifact reads per-token statistics as features ({shown}), which this version does not "
                "support: refit it without them"
            )
        if data.get("products"):
            raise ValueError(
                "the artifact reads the product terms p_i * c_{i-l} as features, which this version does not "
                "support: refit it without them"
            )
        return {key: value for key, value in data.items() if key not in ("extra_stats", "products")}

    @classmethod
    def of(cls, spec: FeatureSpec) -> FeatureInfo:
        """What a manifest records of the features `spec` describes (the inverse of `spec()`)."""
        shared = {name: getattr(spec, name) for name in _SPEC_FIELDS}
        return cls(**shared, stage1_size=spec.stage1_size, stage2_size=spec.stage2_size)

    def spec(self) -> FeatureSpec:
        return FeatureSpec(**{name: getattr(self, name) for name in _SPEC_FIELDS})


def inside_folder(name: str) -> str:
    """A file name a manifest may list: a relative path that stays in the artifact's folder (a manifest naming
    `/tmp/x.joblib` or `../x.joblib` would have the service unpickle a file from elsewhere)."""
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or ".." in parts or "\\" in name:
        raise ValueError(f"{name!r} is not a file inside the artifact's folder")
    return name


class RegressorInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: Annotated[str, AfterValidator(inside_folder)]
    kind: Literal["ridge", "mlp", "mlp+ridge"]  # mlp+ridge: `AveragedRegressor` of the two
    params: dict[str, Any] = Field(default_factory=dict)


class Threshold(BaseModel):
    """A reject threshold chosen on calibration data: reject when U > threshold."""

    model_config = ConfigDict(extra="forbid")

    threshold: float
    kind: Literal["coverage", "error"]
    target: float
    coverage: float  # share of calibration answers accepted at this threshold
    error: float  # share of wrong answers among those accepted
    n: int  # calibration answers
    guarantee: str | None = None

    @field_validator("threshold")
    @classmethod
    def _a_number(cls, value: float) -> float:
        # -inf (reject every answer: no share of the calibration answers is small enough) is a threshold;
        # NaN would reject every answer too, but silently, as if it were one.
        if math.isnan(value):
            raise ValueError("a threshold must be a number, not NaN")
        return value


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format_version: Literal[1] = FORMAT_VERSION
    created_at: str
    llm: ModelIdentity
    # The dtype the training answers were generated in: `dtype=auto` serves the model in it, so that the
    # regressor sees the numbers it was fitted on. Artifacts from before the field were all float32.
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # The capture settings (lags, convention) the answers were generated with; with a regressor, its features.
    features: FeatureInfo
    # The TAD regressor and how its confidences are scored: absent in a calibration-only artifact, which holds
    # the free methods' thresholds and a decision method (`python -m training calibration-artifact`).
    regressor: RegressorInfo | None = None
    epsilon: float | None = Field(None, gt=0.0, lt=1.0)
    aggregation: Aggregation | None = None
    variant: Literal["leak-free", "algorithm1-literal", "authors"] | None = None
    thresholds: dict[Method, dict[str, Threshold]] = Field(default_factory=dict)
    default_target: str | None = None
    # The score the service decides with by default. `fit` writes TAD unless a free score beat it in
    # cross-validation with an interval excluding 0; absent in older artifacts (then: TAD).
    decision_method: Method | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    training: dict[str, Any] = Field(default_factory=dict)
    files: dict[Annotated[str, AfterValidator(inside_folder)], str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _no_blend(cls, data: Any) -> Any:
        """A decision blend was studied and not adopted. Manifests written before its removal still carry
        `"blend": null`: read as if the key were absent (and no longer written). An artifact with a blend is
        refused, since this code would decide on another score than it was calibrated for."""
        if not isinstance(data, dict) or "blend" not in data:
            return data
        if data["blend"] is not None:
            raise ValueError(
                "the artifact has a decision blend (tad_blend), which this version does not support: refit it"
            )
        return {key: value for key, value in data.items() if key != "blend"}

    @field_validator("variant", mode="before")
    @classmethod
    def _renamed_variant(cls, name: Any) -> Any:
        """ "paper-exact" is what "algorithm1-literal" was called in artifacts made before the rename."""
        return "algorithm1-literal" if name == "paper-exact" else name

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if self.regressor is not None:
            missing = [name for name in ("epsilon", "aggregation", "variant") if getattr(self, name) is None]
            if missing:
                raise ValueError(f"a manifest with a regressor needs {', '.join(missing)}")
        else:
            if self.decision_method is None or REGISTRY[self.decision_method.value].needs_regressor:
                raise ValueError("a calibration-only manifest (no regressor) needs a free decision_method")
        return self


@dataclass(frozen=True)
class TrainedTad:
    """The TAD parts of an artifact with a regressor, none of them optional."""

    tad: TadScorer
    regressor: RegressorInfo
    aggregation: Aggregation
    epsilon: float
    variant: str

    @property
    def spec(self) -> FeatureSpec:
        return self.tad.spec


@dataclass(frozen=True)
class TadArtifact:
    path: Path
    manifest: Manifest
    tad: TadScorer | None  # None: a calibration-only artifact
    manifest_sha256: str = ""  # of the bytes this manifest was read from

    @property
    def has_regressor(self) -> bool:
        return self.tad is not None

    def trained(self) -> TrainedTad:
        """Its regressor and how TAD is scored; refused for a calibration-only artifact."""
        manifest = self.manifest
        if self.tad is None or manifest.regressor is None:
            raise ArtifactError(f"artifact {self.path} is calibration-only: it has no TAD regressor")
        # The manifest's validator: a regressor comes with its aggregation, epsilon and variant.
        assert manifest.aggregation is not None and manifest.epsilon is not None and manifest.variant is not None
        return TrainedTad(self.tad, manifest.regressor, manifest.aggregation, manifest.epsilon, manifest.variant)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def n_lags(self) -> int:
        return self.manifest.features.n_lags

    @property
    def convention(self) -> Convention:
        return self.manifest.features.convention

    @property
    def decision_method(self) -> Method:
        """What the service decides with unless told otherwise: the manifest's choice; for artifacts from
        before it was recorded, TAD."""
        if self.manifest.decision_method is not None:
            return self.manifest.decision_method
        return Method("tad")

    def check_model(self, identity: ModelIdentity) -> None:
        """Refuse a model other than the one the regressor was trained on."""
        expected = self.manifest.llm
        if (expected.num_layers, expected.num_heads) != (identity.num_layers, identity.num_heads):
            raise ArtifactError(
                f"artifact {self.path} expects {expected.num_layers} layers x {expected.num_heads} heads, "
                f"the loaded model {identity.name!r} has {identity.num_layers} x {identity.num_heads}"
            )
        if expected.sha256 != identity.sha256 or expected.vocab_size != identity.vocab_size:
            raise ArtifactError(
                f"artifact {self.path} was trained for model {expected.name!r} (weights sha256 "
                f"{expected.sha256[:16]}...), but the loaded model is {identity.name!r} "
                f"(sha256 {identity.sha256[:16]}...)"
            )


def read_manifest(path: Path, raw: bytes | None = None) -> Manifest:
    """`raw`: the manifest's bytes, already read (and hashed) by the caller."""
    manifest_path = path / MANIFEST_NAME
    if raw is None:
        if not manifest_path.is_file():
            raise ArtifactError(f"no {MANIFEST_NAME} in artifact folder {path}")
        raw = manifest_path.read_bytes()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ArtifactError(f"{manifest_path} is not valid JSON (line {error.lineno}, column {error.colno})") from error
    try:
        return Manifest.model_validate(data)
    except ValidationError as error:
        # By field, as request errors are: pydantic's own text quotes the manifest's values.
        problems, _ = validation_message([dict(item) for item in error.errors()], root="the manifest")
        raise ArtifactError(f"invalid {manifest_path}: {problems}") from error


def verify_files(path: Path, files: dict[str, str]) -> dict[str, bytes]:
    """Every file listed (name: sha256) must exist with its recorded sha256: their bytes, read once, so that
    what is loaded is what was hashed (a file swapped between a hash and a second read would be unpickled
    unchecked)."""
    contents = {}
    for name, expected in files.items():
        target = path / name
        if not target.is_file():
            raise ArtifactError(f"{path}: file {name} listed in the manifest is missing")
        contents[name] = target.read_bytes()
        actual = hashlib.sha256(contents[name]).hexdigest()
        if actual != expected:
            raise ArtifactError(
                f"{path}: sha256 of {name} is {actual[:16]}..., the manifest says {expected[:16]}...; "
                "refusing to load it"
            )
    return contents


def load_listed(path: Path, manifest: Manifest, name: str) -> Any:
    """One more file the manifest lists (an alternative regressor), unpickled from the bytes whose hash was
    checked."""
    return joblib.load(io.BytesIO(verify_files(path, {name: manifest.files[name]})[name]))


def load_artifact(path: Path, manifest_sha256: str | None = None) -> TadArtifact:
    """Read, verify and load an artifact folder (hashes first, then `joblib.load`)."""
    path = Path(path)
    manifest_path = path / MANIFEST_NAME
    raw = manifest_path.read_bytes() if manifest_path.is_file() else None  # read once: hashed, then parsed
    digest = hashlib.sha256(raw).hexdigest() if raw is not None else "missing"
    if manifest_sha256 is not None and digest != manifest_sha256:
        raise ArtifactError(f"{path}: manifest sha256 {digest[:16]}... is not the pinned {manifest_sha256[:16]}...")
    manifest = read_manifest(path, raw)
    features = manifest.features
    if features.order != FEATURE_ORDER:
        raise ArtifactError(f"{path}: feature order {features.order!r} is not supported (expected {FEATURE_ORDER!r})")
    spec = features.spec()
    if (features.stage1_size, features.stage2_size) != (spec.stage1_size, spec.stage2_size):
        raise ArtifactError(f"{path}: feature sizes in the manifest do not match its n_lags/layers/heads")
    if manifest.regressor is not None and manifest.regressor.file not in manifest.files:
        raise ArtifactError(f"{path}: the manifest records no sha256 for {manifest.regressor.file}")
    contents = verify_files(path, manifest.files)
    if manifest.regressor is None:
        return TadArtifact(path=path, manifest=manifest, tad=None, manifest_sha256=digest)
    assert manifest.epsilon is not None  # the manifest's validator: a regressor comes with its epsilon
    try:
        regressor = joblib.load(io.BytesIO(contents[manifest.regressor.file]))
    except Exception as error:  # unpickling runs whatever the file says: any failure means "unusable"
        raise ArtifactError(
            f"{path / manifest.regressor.file} cannot be loaded ({type(error).__name__}): not a joblib file, or "
            "saved by a scikit-learn this one cannot read"
        ) from error
    n_features = getattr(regressor, "n_features_in_", None)
    if n_features is not None and n_features != spec.stage2_size:
        raise ArtifactError(
            f"{path}: the regressor takes {n_features} features, the feature spec has {spec.stage2_size}"
        )
    check_regressor(regressor, spec.stage2_size, path / manifest.regressor.file)
    tad = TadScorer(regressor=regressor, spec=spec, epsilon=manifest.epsilon)
    return TadArtifact(path=path, manifest=manifest, tad=tad, manifest_sha256=digest)


def check_regressor(regressor: object, n_features: int, source: Path) -> None:
    """One prediction on a feature row of zeros, so that a file holding something other than a stage-2
    regressor (or one for other features) is refused at load, not on every request that needs TAD."""
    predict = getattr(regressor, "predict", None)
    if not callable(predict):
        raise ArtifactError(f"{source} does not hold a regressor with predict() (it holds: {type(regressor).__name__})")
    try:
        prediction = np.asarray(predict(np.zeros((1, n_features))), dtype=np.float64)
    except Exception as error:  # whatever the object raises: the artifact is unusable either way
        raise ArtifactError(
            f"{source}: the regressor fails on a row of {n_features} features ({type(error).__name__})"
        ) from error
    if prediction.size != 1:  # the scorer reads one value per row (app/uncertainty/tad.py)
        raise ArtifactError(f"{source}: the regressor predicts {prediction.size} values for one row, not one")


def write_manifest(path: Path, manifest: Manifest) -> Manifest:
    """Record the sha256 of every model file (*.joblib) in the folder and write the manifest.

    Reports and plots beside them are not listed: they can be regenerated without
    invalidating the artifact.
    """
    files = {str(item.relative_to(path)): file_sha256(item) for item in sorted(path.rglob("*.joblib"))}
    final = manifest.model_copy(update={"files": files})
    write_text_atomic(path / MANIFEST_NAME, json.dumps(final.model_dump(mode="json"), indent=2) + "\n")
    return final
