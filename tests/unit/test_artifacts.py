"""Artifact resolution: the built-in name, vllm-sr/NAME under the artifacts directory, local
directories, and clear refusals (exit 78)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_sr.config.service import ServiceSettings
from vllm_sr.errors import EXIT_DO_NOT_RESTART, ArtifactError
from vllm_sr.worker.artifacts import (
    ARTIFACTS_DIR_ENV,
    BUILTINS,
    D3_EDGE,
    DEFAULT_ARTIFACTS_DIR,
    artifacts_dir,
    content_hashes,
    installed_path,
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


# -- vllm-sr/NAME under the artifacts directory (issue 30) ----------------------------------


def test_an_installed_name_resolves_under_the_artifacts_directory(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    make_dir(root / "Vela-2.0-4B", config={"model_type": "bert"})
    spec = resolve("vllm-sr/Vela-2.0-4B", root)
    assert spec.path == (root / "Vela-2.0-4B").resolve()
    assert spec.name == "vllm-sr/Vela-2.0-4B" and not spec.builtin


def test_the_workers_artifacts_directory_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ARTIFACTS_DIR_ENV, raising=False)
    assert artifacts_dir() == DEFAULT_ARTIFACTS_DIR == Path("/var/lib/vllm-sr/artifacts")
    assert ServiceSettings().artifacts_dir == DEFAULT_ARTIFACTS_DIR  # one packaged default
    make_dir(tmp_path / "Vela-2.0-4B", config={})
    monkeypatch.setenv(ARTIFACTS_DIR_ENV, str(tmp_path))
    assert artifacts_dir() == tmp_path
    assert resolve("vllm-sr/Vela-2.0-4B").path == (tmp_path / "Vela-2.0-4B").resolve()


def test_a_missing_installed_name_names_every_place_looked_in(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    with pytest.raises(ArtifactError) as info:
        resolve("vllm-sr/Vela-2.0-4B", root)
    msg = info.value.message
    assert "'vllm-sr/Vela-2.0-4B' is not accepted" in msg
    assert f"{root / 'Vela-2.0-4B'} (artifacts directory: no such directory)" in msg
    assert f"{Path('vllm-sr/Vela-2.0-4B').absolute()} (local directory: no such directory)" in msg
    assert f"installed under the artifacts directory {root}" in msg and D3_EDGE in msg
    assert info.value.exit_code == EXIT_DO_NOT_RESTART


def test_an_installed_name_without_a_model_says_what_it_lacks(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match=r"has no config\.json"):
        resolve("vllm-sr/empty", tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArtifactError, match=r"artifacts directory: not a directory"):
        resolve("vllm-sr/file", tmp_path)


@pytest.mark.parametrize("artifact", ["vllm-sr/..", "vllm-sr/a/b", "vllm-sr/.hidden", "other/x"])
def test_only_one_plain_name_is_looked_up_in_the_artifacts_directory(
    tmp_path: Path, artifact: str
) -> None:
    root = tmp_path / "artifacts"
    make_dir(root / "a" / "b", config={})
    make_dir(root / ".hidden", config={})
    make_dir(root / "x", config={})
    assert installed_path(artifact, root) is None
    with pytest.raises(ArtifactError) as info:
        resolve(artifact, root)
    assert "(artifacts directory:" not in info.value.message


def test_builtins_win_and_installed_names_win_over_relative_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "artifacts"
    make_dir(root / "d3-edge", config={})
    assert resolve(D3_EDGE, root).builtin
    make_dir(root / "m", config={"from": "artifacts"})
    make_dir(tmp_path / "cwd" / "vllm-sr" / "m", config={"from": "cwd"})
    monkeypatch.chdir(tmp_path / "cwd")
    assert resolve("vllm-sr/m", root).config == {"from": "artifacts"}
    assert resolve("vllm-sr/m", tmp_path / "nothing-here").config == {"from": "cwd"}
