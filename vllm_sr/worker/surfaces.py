"""The request surfaces without HTTP: validate a body, tokenize it into rows, and turn the
rows' outputs into the response body. ``prepare_*`` returns a ``Prepared`` task whose rows the
caller runs through the engine (alone, or fused with a bundle's other tasks)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy

from vllm_sr.errors import InvalidRequest, MaxLengthExceeded, ModelNotFound, RequestTooLarge
from vllm_sr.worker import classify
from vllm_sr.worker.classify import json_type

MAX_ROWS_PER_REQUEST = 2048  # per request, and over all tasks of a bundle
MAX_TASKS_PER_BUNDLE = 256
# Up to this many rows and characters are tokenized on the event loop (tens of microseconds);
# bigger inputs go to a thread so that /health never waits behind a tokenizer.
TOKENIZE_INLINE_ROWS = 16
TOKENIZE_INLINE_CHARS = 16384


@dataclass
class ModelView:
    """What the surfaces need to know about the loaded model."""

    name: str
    names: frozenset[str]  # every name a request's "model" may use
    dimensions: int
    max_length: int
    head_labels: list[str] | None
    encode: Callable[[list[str]], list[list[int]]]
    truncate: Callable[[list[int], int], list[int]]
    vocab_size: int | None = None  # token ids a caller may send are 0 .. vocab_size - 1
    token_head: bool = False  # the head's outputs are per-label token maxima, not logits
    multi_label_head: bool = False  # sigmoid per label (problem_type multi_label_classification)
    limit_name: str = "the model's maximum"  # what max_length is, in a max_length_exceeded error
    overflow_truncates: bool = False  # input.overflow truncate: cut over-long inputs by default


@dataclass(frozen=True)
class InputLimit:
    tokens: int
    name: str  # how a max_length_exceeded error names it


def input_limit(model_max: int, max_input_tokens: int | None) -> InputLimit:
    """The longest input a request may send: the deployment's input.max_tokens, capped at what
    the model (and one forward) can take."""
    if max_input_tokens is None or max_input_tokens >= model_max:
        return InputLimit(model_max, "the model's maximum")
    return InputLimit(max_input_tokens, "the deployment's input.max_tokens")


@dataclass
class Prepared:
    surface: str
    rows: list[list[int]]
    tokens: int
    finish: Callable[[numpy.ndarray], dict[str, Any]]


def check_model(body: dict[str, Any], view: ModelView) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise InvalidRequest(f"model: expected a string, got {json_type(model)}")
    if model not in view.names:
        raise ModelNotFound(
            f"model {model!r} is not served here; this worker serves {view.name!r}",
            model=model,
        )


def parse_input(body: dict[str, Any], field: str = "input") -> list[str]:
    if field not in body:
        raise InvalidRequest(f"{field}: required (a string or a list of strings)")
    value = body[field]
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise InvalidRequest(
            f"{field}: expected a string or a list of strings, got {json_type(value)}"
        )
    if not value:
        raise InvalidRequest(f"{field}: the list is empty; give at least one string")
    if len(value) > MAX_ROWS_PER_REQUEST:
        raise RequestTooLarge(
            f"{field}: {len(value)} rows; at most {MAX_ROWS_PER_REQUEST} per request"
        )
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidRequest(f"{field}[{i}]: expected a string, got {json_type(item)}")
    return value


def parse_truncate(body: dict[str, Any]) -> bool:
    value = body.get("truncate", False)
    if not isinstance(value, bool):
        raise InvalidRequest(f"truncate: expected true or false, got {json_type(value)}")
    return value


def tokenize(
    texts: list[str], view: ModelView, truncate: bool, field: str = "input"
) -> list[list[int]]:
    rows = view.encode(texts)
    limit = view.max_length
    truncate = truncate or view.overflow_truncates
    for i, ids in enumerate(rows):
        if len(ids) > limit:
            if not truncate:
                where = f"{field}[{i}]" if len(texts) > 1 else field
                raise MaxLengthExceeded(
                    f"{where}: {len(ids)} tokens is over {view.limit_name} of {limit}; "
                    'shorten it or send "truncate": true',
                    index=i,
                    tokens=len(ids),
                    max_length=limit,
                )
            rows[i] = view.truncate(ids, limit)
    return rows


def is_token_ids(value: Any) -> bool:
    """OpenAI's token-id forms of ``input``: ``[101, 2023, ...]`` (one row) or
    ``[[101, ...], [...]]`` (several); judged by the first item."""
    if not isinstance(value, list) or not value:
        return False
    first = value[0]
    return isinstance(first, list) or (isinstance(first, int) and not isinstance(first, bool))


def _check_ids(row: Any, where: str, vocab_size: int | None) -> list[int]:
    if not isinstance(row, list):
        raise InvalidRequest(f"{where}: expected a list of token ids, got {json_type(row)}")
    if not row:
        raise InvalidRequest(f"{where}: the token list is empty; give at least one token id")
    for j, token in enumerate(row):
        if type(token) is not int:
            raise InvalidRequest(
                f"{where}[{j}]: expected a token id (an integer), got {json_type(token)}"
            )
    low, high = min(row), max(row)
    top = None if vocab_size is None else vocab_size - 1
    if low < 0 or (top is not None and high > top):
        bad = low if low < 0 else high
        accepted = f"0 to {top}" if top is not None else "0 or more"
        raise InvalidRequest(
            f"{where}[{row.index(bad)}]: token id {bad} is outside the model's vocabulary "
            f"(accepted: {accepted})"
        )
    return row


def token_rows(
    value: list[Any], view: ModelView, truncate: bool, field: str = "input"
) -> list[list[int]]:
    """Validate token-id input (see ``is_token_ids``) into rows: ids in the vocabulary, no
    empty row, each within the maximum length (or cut to it with ``truncate``)."""
    single = not isinstance(value[0], list)
    rows_in: list[Any] = [value] if single else value
    if len(rows_in) > MAX_ROWS_PER_REQUEST:
        raise RequestTooLarge(
            f"{field}: {len(rows_in)} rows; at most {MAX_ROWS_PER_REQUEST} per request"
        )
    rows: list[list[int]] = []
    limit = view.max_length
    truncate = truncate or view.overflow_truncates
    for i, raw in enumerate(rows_in):
        where = field if single else f"{field}[{i}]"
        ids = _check_ids(raw, where, view.vocab_size)
        if len(ids) > limit:
            if not truncate:
                raise MaxLengthExceeded(
                    f"{where}: {len(ids)} tokens is over {view.limit_name} of {limit}; "
                    'shorten it or send "truncate": true',
                    index=i,
                    tokens=len(ids),
                    max_length=limit,
                )
            ids = view.truncate(ids, limit)
        rows.append(ids)
    return rows


# -- embeddings ----------------------------------------------------------------------------


def validate_embeddings(
    body: dict[str, Any], view: ModelView
) -> tuple[list[str] | list[Any], bool, str]:
    """-> (texts, or token-id input when ``is_token_ids`` says so; truncate; format)."""
    check_model(body, view)
    raw: Any = body.get("input")
    texts: list[str] | list[Any] = raw if is_token_ids(raw) else parse_input(body)
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise InvalidRequest(f"encoding_format: {fmt!r} is not accepted; use float or base64")
    dims = body.get("dimensions")
    if dims is not None and (
        isinstance(dims, bool) or not isinstance(dims, int) or dims != view.dimensions
    ):
        raise InvalidRequest(
            f"dimensions: {dims!r} is not supported; this model answers {view.dimensions} "
            "dimensions only (omit the field)"
        )
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequest(f"user: expected a string, got {json_type(user)}")
    return texts, parse_truncate(body), str(fmt)


def embeddings_finisher(
    view: ModelView, fmt: str, tokens: int
) -> Callable[[numpy.ndarray], dict[str, Any]]:
    def finish(out: numpy.ndarray) -> dict[str, Any]:
        vectors = numpy.ascontiguousarray(out[:, : view.dimensions], dtype=numpy.float32)
        if fmt == "base64":
            data = [
                {"object": "embedding", "index": i, "embedding": base64.b64encode(v).decode()}
                for i, v in enumerate(vectors)
            ]
        else:
            data = [
                {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
            ]
        return {
            "object": "list",
            "data": data,
            "model": view.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    return finish


# -- classify ------------------------------------------------------------------------------


def validate_classify(
    body: dict[str, Any], view: ModelView
) -> tuple[list[str], bool, classify.LabelKey | None]:
    check_model(body, view)
    texts = parse_input(body)
    truncate = parse_truncate(body)
    raw_labels = body.get("labels")
    if raw_labels is None:
        if view.head_labels is None:
            raise InvalidRequest(
                "labels: required for this model (it has no classification head); give "
                "{label: [example phrases]}"
            )
        return texts, truncate, None
    return texts, truncate, classify.parse_labels(raw_labels)


def classify_finisher(
    view: ModelView, tokens: int, centroids: numpy.ndarray | None, key: classify.LabelKey | None
) -> Callable[[numpy.ndarray], dict[str, Any]]:
    def finish(out: numpy.ndarray) -> dict[str, Any]:
        if centroids is not None and key is not None:
            emb = out[:, : view.dimensions].astype(numpy.float32)
            data = classify.by_centroids(emb, centroids, [name for name, _ in key])
        else:
            assert view.head_labels is not None
            head = out[:, view.dimensions :]
            if view.token_head:
                data = classify.by_token_maxima(head, view.head_labels)
            elif view.multi_label_head:
                data = classify.by_sigmoid(head, view.head_labels)
            else:
                data = classify.by_logits(head, view.head_labels)
        return {
            "object": "list",
            "data": data,
            "model": view.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    return finish


# -- bundle --------------------------------------------------------------------------------


def _one_id_row(value: list[Any]) -> bool:
    return is_token_ids(value) and not isinstance(value[0], list)


def parse_bundle(body: dict[str, Any], view: ModelView) -> list[tuple[Any, str, Any]]:
    """-> [(id, surface, task body)]. A task body inherits the bundle's ``model``."""
    check_model(body, view)
    tasks = body.get("tasks")
    if not isinstance(tasks, list):
        raise InvalidRequest(f"tasks: expected a list of tasks, got {json_type(tasks)}")
    if not tasks:
        raise InvalidRequest("tasks: the list is empty; give at least one task")
    if len(tasks) > MAX_TASKS_PER_BUNDLE:
        raise RequestTooLarge(
            f"tasks: {len(tasks)} tasks; at most {MAX_TASKS_PER_BUNDLE} per bundle"
        )
    out = []
    total = 0
    for i, task in enumerate(tasks):
        if not isinstance(task, dict):
            raise InvalidRequest(f"tasks[{i}]: expected an object, got {json_type(task)}")
        surfaces = [s for s in ("embeddings", "classify") if s in task]
        extra = set(task) - {"id", "embeddings", "classify"}
        if len(surfaces) != 1 or extra:
            raise InvalidRequest(
                f"tasks[{i}]: expected {{'id', and one of 'embeddings' or 'classify'}}, "
                f"got keys {sorted(task)}"
            )
        inner = task[surfaces[0]]
        if not isinstance(inner, dict):
            raise InvalidRequest(
                f"tasks[{i}].{surfaces[0]}: expected an object, got {json_type(inner)}"
            )
        if "model" not in inner and "model" in body:
            inner = {**inner, "model": body["model"]}
        rows = inner.get("input")
        total += len(rows) if isinstance(rows, list) and not _one_id_row(rows) else 1
        out.append((task.get("id", i), surfaces[0], inner))
    if total > MAX_ROWS_PER_REQUEST:
        raise RequestTooLarge(
            f"tasks: {total} rows in all; at most {MAX_ROWS_PER_REQUEST} per bundle"
        )
    return out
