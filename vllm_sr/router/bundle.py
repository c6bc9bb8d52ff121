"""The worker's ``POST /v1/bundle`` as Router mode speaks it: the one place its request is
built and its answer decoded (the routing questions, the response cache's query embedding and
tool_selection's tool embeddings all go through here; docs/worker.md has the wire format).

- :func:`embed_task` and :func:`request` build the body: tasks ``{"id", "<surface>": body}``,
  embeddings asked as base64 and truncated to the model's length.
- :func:`decode` reads an answer into its results by task id (:class:`TaskResult`: the task's
  status and body); :func:`embeddings` reads a 200 embeddings body into rows of float32.
  Anything malformed raises :class:`BundleAnswerError`; callers say what it means for them.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy

from vllm_sr.jsontypes import JsonObject, json_object, json_str
from vllm_sr.router.signals import FloatArray

BUNDLE_PATH = "/v1/bundle"


class BundleAnswerError(ValueError):
    """A bundle answer that cannot be read (not JSON, no results, a bad embeddings body)."""


def embed_task(task_id: str, texts: Sequence[str]) -> JsonObject:
    """An embeddings task for ``texts`` (base64 rows, truncated to the model's length)."""
    return {
        "id": task_id,
        "embeddings": {"input": list(texts), "encoding_format": "base64", "truncate": True},
    }


def request(tasks: Sequence[JsonObject]) -> bytes:
    """A bundle request's body."""
    return json.dumps({"tasks": list(tasks)}, ensure_ascii=False).encode()


@dataclass(frozen=True)
class TaskResult:
    status: object  # 200 when the task succeeded
    body: object

    @property
    def ok(self) -> bool:
        return self.status == 200

    def error(self) -> JsonObject:
        """A refused task's error object (``code``, ``message``); empty when it has none."""
        body = json_object(self.body)
        err = json_object(body.get("error")) if body is not None else None
        return err if err is not None else {}


def decode(answer: bytes) -> dict[str, TaskResult]:
    """A bundle answer's results by task id."""
    try:
        doc = json_object(json.loads(answer))
        results = doc.get("results") if doc is not None else None
        if not isinstance(results, list):
            raise ValueError("no results list")
        out = {}
        for item in results:
            res = json_object(item)
            task_id = json_str(res.get("id")) if res is not None else None
            if res is None or task_id is None:
                raise ValueError(f"a result without an id: {item!r:.80}")
            out[task_id] = TaskResult(res.get("status"), res.get("body"))
        return out
    except ValueError as exc:
        raise BundleAnswerError(f"no results ({exc})") from None


def embeddings(body: object) -> FloatArray:
    """A 200 embeddings body's rows (base64 or lists of numbers), one float32 row each."""
    try:
        data = json_object(body)
        items = data.get("data") if data is not None else None
        if not isinstance(items, list):
            raise ValueError("no data list")
        rows = [_embedding_of(item) for item in items]
        if not rows:
            return numpy.zeros((0,), dtype=numpy.float32)
        texts = [r for r in rows if type(r) is str]
        if len(texts) == len(rows):
            return _base64_rows(texts)
        return numpy.stack(
            [
                numpy.frombuffer(base64.b64decode(r), dtype=numpy.float32)
                if isinstance(r, str)
                else numpy.asarray(r, dtype=numpy.float32)
                for r in rows
            ]
        )
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise BundleAnswerError(f"bad embeddings ({exc})") from None


def _base64_rows(rows: list[str]) -> FloatArray:
    """Base64 rows (what the router asks for) into one writable float32 matrix: each row
    decoded as :func:`base64.b64decode` decodes it (the same bytes, the same errors), the
    bytes joined and read once, instead of an array per row and a stack (a chat reads a few
    of these per answer on the event loop)."""
    raw = [binascii.a2b_base64(r) for r in rows]
    size = len(raw[0])
    if size % 4 or any(len(b) != size for b in raw):
        raise ValueError("embedding rows of differing or partial float32 lengths")
    out: FloatArray = numpy.frombuffer(bytearray().join(raw), dtype=numpy.float32)
    return out.reshape(len(raw), size // 4)


def _embedding_of(item: object) -> object:
    row = json_object(item)
    if row is None or "embedding" not in row:
        raise ValueError(f"a data item without an embedding: {item!r:.80}")
    return row["embedding"]


def task_embeddings(answer: bytes, task_id: str) -> list[FloatArray] | None:
    """One task's embedding rows from a bundle answer; None when the answer cannot be read or
    the task is missing or was refused (a caller that can do without them)."""
    try:
        result = decode(answer).get(task_id)
        if result is None or not result.ok:
            return None
        return list(embeddings(result.body))
    except BundleAnswerError:
        return None
