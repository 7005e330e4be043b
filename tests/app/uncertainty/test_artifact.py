"""Artifacts are refused, with a clear error, when a file, the feature spec or the model does not match."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import joblib
import numpy as np
import pytest

from app.hashing import file_sha256
from app.identity import ModelIdentity
from app.uncertainty.artifact import ArtifactError, load_artifact, read_manifest, write_manifest
from app.uncertainty.methods import REGISTRY


@pytest.fixture
def artifact_copy(tiny_artifact: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_artifact, tmp_path / "artifact"))


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _write_manifest(path: Path, manifest: dict) -> None:
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_loads_and_describes_itself(artifact_copy: Path) -> None:
    artifact = load_artifact(artifact_copy)
    manifest = artifact.manifest
    assert manifest.features.stage2_size == artifact.tad.spec.stage2_size
    assert set(manifest.files) >= {"regressor.joblib", "stage1.joblib"}
    assert manifest.variant in ("leak-free", "algorithm1-literal", "authors") and manifest.aggregation.value in (
        "mean",
        "sum-log",
    )
    assert manifest.metrics["cv"]["chosen"]["variant"] == manifest.variant


def test_a_tampered_byte_is_refused_before_unpickling(artifact_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = artifact_copy / "regressor.joblib"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    calls: list[Path] = []
    monkeypatch.setattr(joblib, "load", lambda *a, **k: calls.append(a[0]))
    with pytest.raises(ArtifactError, match=r"sha256 of regressor\.joblib"):
        load_artifact(artifact_copy)
    assert calls == []


def test_missing_file_and_missing_hash_are_refused(artifact_copy: Path) -> None:
    (artifact_copy / "stage1.joblib").unlink()
    with pytest.raises(ArtifactError, match="missing"):
        load_artifact(artifact_copy)
    manifest = _manifest(artifact_copy)
    manifest["files"] = {}
    _write_manifest(artifact_copy, manifest)
    with pytest.raises(ArtifactError, match="no sha256"):
        load_artifact(artifact_copy)


def test_feature_spec_mismatch_is_refused(artifact_copy: Path) -> None:
    manifest = _manifest(artifact_copy)
    manifest["features"]["n_lags"] += 1
    _write_manifest(artifact_copy, manifest)
    with pytest.raises(ArtifactError, match="feature sizes"):
        load_artifact(artifact_copy)
    manifest["features"]["n_lags"] -= 1
    manifest["features"]["order"] = "something-else"
    _write_manifest(artifact_copy, manifest)
    with pytest.raises(ArtifactError, match="feature order"):
        load_artifact(artifact_copy)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("extra_stats", ["entropy"], r"reads per-token statistics as features \(entropy\)"),
        ("products", True, r"reads the product terms p_i \* c_\{i-l\} as features"),
    ],
)
def test_features_of_studies_not_adopted_are_refused(
    artifact_copy: Path, field: str, value: object, message: str
) -> None:
    """An artifact fitted with them (`fit --extra-stats`, `--products` of earlier versions) would be scored on other
    features than it was fitted on; empty and false, as manifests written before their removal carry them, they
    load, and are no longer written."""
    manifest = _manifest(artifact_copy)
    assert field not in manifest["features"]  # not written any more
    manifest["features"][field] = [] if field == "extra_stats" else False  # as older manifests carry it
    _write_manifest(artifact_copy, manifest)
    assert field not in load_artifact(artifact_copy).manifest.features.model_dump()
    manifest["features"][field] = value
    _write_manifest(artifact_copy, manifest)
    with pytest.raises(ArtifactError, match=message):
        load_artifact(artifact_copy)


def test_a_manifest_with_a_null_blend_loads_and_one_with_a_blend_is_refused(artifact_copy: Path) -> None:
    """Manifests written before the decision blend was removed carry `"blend": null`: they load, and the key is
    not written back; an artifact with a blend installed would be decided on another score than it was
    calibrated for. Any other unknown key is still refused."""
    manifest = _manifest(artifact_copy)
    assert "blend" not in manifest
    _write_manifest(artifact_copy, {**manifest, "blend": None})
    loaded = load_artifact(artifact_copy)
    write_manifest(artifact_copy, loaded.manifest)
    assert _manifest(artifact_copy) == manifest
    blend = {"terms": [{"method": "tad", "weight": 0.7, "mean": 0.0, "scale": 1.0}]}
    _write_manifest(artifact_copy, {**manifest, "blend": blend})
    with pytest.raises(ArtifactError, match=r"decision blend \(tad_blend\)"):
        load_artifact(artifact_copy)
    _write_manifest(artifact_copy, {**manifest, "unknown": None})
    with pytest.raises(ArtifactError, match="unknown"):
        load_artifact(artifact_copy)


@pytest.mark.parametrize(
    ("written", "read"),
    [("paper-exact", "algorithm1-literal"), ("algorithm1-literal", "algorithm1-literal"), ("authors", "authors")],
)
def test_a_variant_is_read_by_its_current_name(artifact_copy: Path, written: str, read: str) -> None:
    """ "paper-exact" is what algorithm1-literal was called before the rename: such artifacts load under
    the new name, and an unknown variant is refused."""
    manifest = _manifest(artifact_copy)
    _write_manifest(artifact_copy, {**manifest, "variant": written})
    assert load_artifact(artifact_copy).manifest.variant == read
    _write_manifest(artifact_copy, {**manifest, "variant": "exact"})
    with pytest.raises(ArtifactError, match="variant"):
        load_artifact(artifact_copy)


def test_a_nan_threshold_is_refused(artifact_copy: Path) -> None:
    manifest = _manifest(artifact_copy)
    method = next(iter(manifest["thresholds"]))
    target = next(iter(manifest["thresholds"][method]))
    manifest["thresholds"][method][target]["threshold"] = math.nan  # json writes NaN, and reads it back
    _write_manifest(artifact_copy, manifest)
    with pytest.raises(ArtifactError, match="not NaN"):
        load_artifact(artifact_copy)


def test_invalid_or_absent_manifest(artifact_copy: Path, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"no manifest\.json"):
        load_artifact(tmp_path / "nowhere")
    (artifact_copy / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match=r"manifest\.json is not valid JSON \(line 1, column 2\)$"):
        load_artifact(artifact_copy)


def test_an_invalid_manifest_is_named_by_field_without_quoting_its_values(artifact_copy: Path) -> None:
    # The message reaches an operator through POST /admin/reload-artifact: pydantic's own text would quote
    # the manifest's content and link its documentation.
    manifest = _manifest(artifact_copy)
    del manifest["llm"]
    manifest["epsilon"] = "secret-looking value"
    _write_manifest(artifact_copy, manifest)
    with pytest.raises(ArtifactError) as refused:
        load_artifact(artifact_copy)
    message = str(refused.value)
    assert "llm: Field required" in message and "epsilon:" in message
    assert "secret-looking" not in message and "pydantic.dev" not in message and "input_value" not in message


@pytest.mark.parametrize(
    ("payload", "message"),
    [(5, r"does not hold a regressor .*\(it holds: int\)"), ("text", r"\(it holds: str\)")],
)
def test_a_regressor_file_that_holds_no_regressor_is_refused_at_load(
    artifact_copy: Path, payload: object, message: str
) -> None:
    joblib.dump(payload, artifact_copy / "regressor.joblib")
    write_manifest(artifact_copy, read_manifest(artifact_copy))
    with pytest.raises(ArtifactError, match=message):
        load_artifact(artifact_copy)


def test_a_regressor_predicting_more_than_one_value_is_refused_at_load(artifact_copy: Path) -> None:
    from sklearn.linear_model import Ridge

    size = read_manifest(artifact_copy).features.stage2_size
    two_outputs = Ridge().fit(np.zeros((2, size)), [[0.0, 1.0], [1.0, 0.0]])
    joblib.dump(two_outputs, artifact_copy / "regressor.joblib")
    write_manifest(artifact_copy, read_manifest(artifact_copy))
    with pytest.raises(ArtifactError, match=r"predicts 2 values for one row, not one"):
        load_artifact(artifact_copy)
    one_column = Ridge().fit(np.zeros((2, size)), [[0.0], [1.0]])  # a stage 2 fitted on a column target: fine
    joblib.dump(one_column, artifact_copy / "regressor.joblib")
    write_manifest(artifact_copy, read_manifest(artifact_copy))
    load_artifact(artifact_copy)


def test_a_regressor_failing_on_a_feature_row_is_refused_at_load(artifact_copy: Path) -> None:
    joblib.dump(_FailsToPredict(), artifact_copy / "regressor.joblib")
    write_manifest(artifact_copy, read_manifest(artifact_copy))
    with pytest.raises(ArtifactError, match=r"the regressor fails on a row of \d+ features \(ValueError\)"):
        load_artifact(artifact_copy)


def test_a_regressor_file_that_is_no_pickle_is_an_artifact_error(artifact_copy: Path) -> None:
    # Hashes that match a file joblib cannot read: at start this was "unexpected KeyError while loading".
    (artifact_copy / "regressor.joblib").write_bytes(b"not a pickle at all")
    write_manifest(artifact_copy, read_manifest(artifact_copy))
    with pytest.raises(ArtifactError, match=r"regressor\.joblib cannot be loaded \(\w+\): not a joblib file"):
        load_artifact(artifact_copy)


class _FailsToPredict:
    """Picklable (module level): a regressor whose predict raises, as one fitted on other features would."""

    def predict(self, features: np.ndarray) -> np.ndarray:
        raise ValueError("shapes (1,3381) and (3,) not aligned")


def test_pinned_manifest_hash(artifact_copy: Path) -> None:
    load_artifact(artifact_copy, manifest_sha256=file_sha256(artifact_copy / "manifest.json"))
    with pytest.raises(ArtifactError, match="pinned"):
        load_artifact(artifact_copy, manifest_sha256="0" * 64)


def test_other_model_is_refused(artifact_copy: Path) -> None:
    artifact = load_artifact(artifact_copy)
    own = artifact.manifest.llm
    artifact.check_model(own)
    with pytest.raises(ArtifactError, match="trained for model"):
        artifact.check_model(ModelIdentity(**{**own.model_dump(), "sha256": "f" * 64}))
    with pytest.raises(ArtifactError, match="layers"):
        artifact.check_model(ModelIdentity(**{**own.model_dump(), "num_layers": own.num_layers + 1}))


@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b-tad", "smollm2-135m-instruct-tad", "gemma3-270m-tad"])
def test_committed_artifacts_load_with_their_hashes_and_score(name: str) -> None:
    """Each artifact under models/ loads (every file's hash checked) and scores a sequence of its model's shape."""
    import numpy as np

    path = Path(__file__).resolve().parents[3] / "models" / name
    artifact = load_artifact(path)
    spec = artifact.tad.spec
    assert (spec.num_layers, spec.num_heads) == (artifact.manifest.llm.num_layers, artifact.manifest.llm.num_heads)
    rng = np.random.default_rng(0)
    logprobs = np.log(rng.uniform(0.05, 1.0, 6))
    rows = rng.uniform(0.0, 0.2, (6, spec.num_layers, spec.num_heads, spec.n_lags + 1)).astype(np.float32)
    confidences = artifact.tad.confidences(logprobs, rows)
    assert confidences.shape == (6,) and np.all((confidences >= artifact.tad.epsilon) & (confidences <= 1.0))


def test_the_committed_calibration_only_artifact_loads_and_decides_with_a_free_score() -> None:
    path = Path(__file__).resolve().parents[3] / "models" / "qwen2.5-coder-1.5b-calibration"
    artifact = load_artifact(path)
    assert not artifact.has_regressor and artifact.tad is None
    method = artifact.decision_method
    assert not REGISTRY[method.value].needs_regressor
    assert artifact.manifest.default_target in artifact.manifest.thresholds[method]
    assert artifact.manifest.dtype == "bfloat16"


def test_a_file_replaced_after_its_hash_is_not_what_is_loaded(
    artifact_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hashed, then read again to unpickle, a file swapped in between would be loaded unchecked (the manifest
    pin and the file hashes exist against exactly that): each file is read once, and its hashed bytes loaded."""
    import hashlib
    from types import SimpleNamespace

    from app.uncertainty import artifact as artifact_module

    regressor = artifact_copy / "regressor.joblib"
    original = regressor.read_bytes()

    def sha256_then_swap(data: bytes) -> object:
        digest = hashlib.sha256(data)
        if data == original:  # the attacker's moment: just after the hash
            joblib.dump(_FailsToPredict(), regressor)
        return digest

    monkeypatch.setattr(artifact_module, "hashlib", SimpleNamespace(sha256=sha256_then_swap))
    loaded = load_artifact(artifact_copy)  # the swapped file would fail on its feature row
    assert loaded.tad is not None and not isinstance(loaded.tad.regressor, _FailsToPredict)
    assert regressor.read_bytes() != original  # the swap did happen
    assert loaded.manifest_sha256 == file_sha256(artifact_copy / "manifest.json")


@pytest.mark.parametrize("name", ["../elsewhere.joblib", "/tmp/elsewhere.joblib", "sub/../../x.joblib", ""])
def test_a_manifest_naming_a_file_outside_its_folder_is_refused(artifact_copy: Path, name: str) -> None:
    manifest = _manifest(artifact_copy)
    manifest["files"][name] = "0" * 64
    _write_manifest(artifact_copy, manifest)
    with pytest.raises(ArtifactError, match="is not a file inside the artifact's folder"):
        load_artifact(artifact_copy)
    manifest = _manifest(artifact_copy)
    del manifest["files"][name]
    manifest["regressor"]["file"] = name
    _write_manifest(artifact_copy, manifest)
    with pytest.raises(ArtifactError, match="is not a file inside the artifact's folder"):
        load_artifact(artifact_copy)
