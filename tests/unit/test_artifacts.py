"""Artifact resolution: the built-in name, local directories, and clear refusals (exit 78)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_sr.errors import EXIT_DO_NOT_RESTART, ArtifactError
from vllm_sr.worker.artifacts import (
    BUILTINS,
    D3_EDGE,
    content_hashes,
    resolve,
    revision_mismatch,
    revision_of,
    weights_sha256,
)


def make_dir(path: Path, config: dict | None = None, weights: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    if weights:
        (path / "model.safetensors").write_bytes(b"not really weights")
    return path


def test_builtin_resolves_to_the_wheel_model_dir() -> None:
    spec = resolve(D3_EDGE)
    assert spec.builtin
    assert (spec.path / "config.json").exists()
    assert spec.path.name == "model"
    assert spec.classifier_labels is None


@pytest.mark.parametrize("artifact", ["vllm-sr/d3-edg", "sentence-transformers/all-MiniLM-L6-v2"])
def test_unknown_name_names_the_artifact_builtins_and_forms(artifact: str) -> None:
    with pytest.raises(ArtifactError) as info:
        resolve(artifact)
    msg = info.value.message
    assert repr(artifact) in msg
    for name in BUILTINS:
        assert name in msg
    assert "local directory" in msg
    assert info.value.exit_code == EXIT_DO_NOT_RESTART == 78


def test_a_file_is_not_a_directory(tmp_path: Path) -> None:
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    with pytest.raises(ArtifactError, match="not a directory"):
        resolve(str(f))


def test_directory_without_config(tmp_path: Path) -> None:
    d = make_dir(tmp_path / "m", config=None)
    with pytest.raises(ArtifactError, match=r"no config\.json"):
        resolve(str(d))


def test_directory_without_weights(tmp_path: Path) -> None:
    d = make_dir(tmp_path / "m", config={"model_type": "bert"}, weights=False)
    with pytest.raises(ArtifactError, match="holds no weights"):
        resolve(str(d))


def test_config_that_is_not_json(tmp_path: Path) -> None:
    d = make_dir(tmp_path / "m", config=None)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="cannot read"):
        resolve(str(d))


def test_local_dir_with_id2label_is_a_classifier_in_label_order(tmp_path: Path) -> None:
    d = make_dir(tmp_path / "m", config={"id2label": {"1": "b", "0": "a", "10": "k", "2": "c"}})
    assert resolve(str(d)).classifier_labels == ["a", "b", "c", "k"]


def test_local_dir_without_id2label_embeds_only(tmp_path: Path) -> None:
    d = make_dir(tmp_path / "m", config={"model_type": "bert"})
    spec = resolve(str(d))
    assert not spec.builtin
    assert spec.classifier_labels is None


def test_weights_hash_follows_the_bytes(tmp_path: Path) -> None:
    a = make_dir(tmp_path / "a", config={})
    b = make_dir(tmp_path / "b", config={})
    assert weights_sha256(a) == weights_sha256(b)
    (b / "model.safetensors").write_bytes(b"other weights")
    assert weights_sha256(a) != weights_sha256(b)


def _model_dir(root: Path, weights: bytes = b"w") -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(weights)
    (root / "tokenizer.json").write_text('{"vocab": 1}')
    return root


def test_content_hash_covers_every_file_but_hidden_ones(tmp_path: Path) -> None:
    a = _model_dir(tmp_path / "a")
    b = _model_dir(tmp_path / "b")
    whole, weights = content_hashes(a)
    assert (whole, weights) == content_hashes(b)
    assert weights == weights_sha256(a)
    (b / ".cache" / "huggingface").mkdir(parents=True)
    (b / ".cache" / "huggingface" / "lock").write_text("x")
    (b / ".gitattributes").write_text("*.bin lfs")
    assert content_hashes(b)[0] == whole  # hidden entries change nothing
    (b / "tokenizer.json").write_text('{"vocab": 2}')
    changed, same_weights = content_hashes(b)
    assert changed != whole and same_weights == weights  # not a weight file, still counted
    (b / "tokenizer.json").write_text('{"vocab": 1}')
    (b / "sub").mkdir()
    (b / "sub" / "extra.txt").write_text("")
    assert content_hashes(b)[0] != whole  # a new file, even empty, is new content
    assert revision_of(whole) == f"sha256:{whole[:16]}"


def test_a_revision_asked_for_must_name_the_content(tmp_path: Path) -> None:
    whole, _ = content_hashes(_model_dir(tmp_path / "m"))
    assert revision_mismatch("m", None, whole) is None
    for same in (revision_of(whole), whole, whole[:7], f"SHA256:{whole[:12].upper()}"):
        assert revision_mismatch("m", same, whole) is None, same
    note = revision_mismatch("./m", "v1.2", whole)
    assert note is not None
    assert "'v1.2'" in note and "'./m'" in note and revision_of(whole) in note
    assert revision_mismatch("m", whole[:6], whole) is not None  # too short to name it


def test_builtin_revision_is_the_content_hash_of_its_directory() -> None:
    spec = resolve(D3_EDGE)
    whole, weights = content_hashes(spec.path)
    assert revision_of(whole).startswith("sha256:") and len(revision_of(whole)) == 23
    assert weights == weights_sha256(spec.path)
