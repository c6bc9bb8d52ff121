"""The questions a request asks the deployments, and their answers as signal inputs.

Only signals some decision references are evaluated. Per deployment, one request asks ONE
bundle (``POST /v1/bundle``, see vllm_sr/worker/surfaces.py) with ONE row: task ``query``, the
request text's embedding (base64 float32). Everything else is computed here from it:

- embedding signals: cosine to the candidates' embeddings;
- domain signals: the labelled classification the worker's ``/v1/classify`` does (the same
  code, ``vllm_sr.worker.classify``): each domain's centroid is the normalised mean of its
  examples' embeddings (description + examples), the probabilities are
  ``softmax(cosine / 0.05)`` over every domain on the deployment, and the label is the best.

The candidates and the examples are embedded once per config generation (task
``candidates``, in :meth:`DeploymentQuestions.warm_bundle` or else in the first request's
bundle) and cached here, so a routed request costs one row of one forward, however many
signals ask. Texts go with ``truncate: true``: a long prompt is routed on its first tokens
rather than refused.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import numpy

from vllm_sr.config.routing import DomainSignal, EmbeddingSignal, Routing
from vllm_sr.errors import VllmSrError
from vllm_sr.router.rules import SignalKey, leaves
from vllm_sr.router.signals import (
    KeywordMatcher,
    SignalResult,
    domain_results,
    embedding_result,
    keyword_matcher,
    normalize_rows,
)
from vllm_sr.worker import classify
from vllm_sr.worker.classify import LabelKey

BUNDLE_PATH = "/v1/bundle"
TASK_QUERY = "query"
TASK_CANDIDATES = "candidates"


class SignalAnswerError(VllmSrError):
    """A deployment answered the routing bundle, but not with what the router asked for."""

    code = "bad_signal_answer"
    http_status = 502
    retryable = True


@dataclass
class DeploymentQuestions:
    deployment: str
    embeddings: list[EmbeddingSignal]
    domains: list[DomainSignal]  # the deployment's whole label set ([] when none is referenced)
    referenced_domains: frozenset[str]
    # Embedded once per config generation: the candidates, then the domains' examples.
    texts: list[str] = field(default_factory=list)
    slices: dict[str, slice] = field(default_factory=dict)
    label_key: LabelKey = ()
    # Normalised candidate embeddings per signal, and the domain centroids, once known.
    candidates: dict[str, numpy.ndarray] | None = None
    centroids: numpy.ndarray | None = None

    def __post_init__(self) -> None:
        for sig in self.embeddings:
            self.slices[sig.name] = slice(len(self.texts), len(self.texts) + len(sig.candidates))
            self.texts.extend(sig.candidates)
        self.label_key = tuple((d.name, tuple(d.label_examples())) for d in self.domains)
        for _, examples in self.label_key:
            self.texts.extend(examples)

    @property
    def cached(self) -> bool:
        return self.candidates is not None

    def signal_keys(self) -> list[SignalKey]:
        """The signals this deployment answers (for per-signal errors when it fails)."""
        out: list[SignalKey] = [("embedding", s.name) for s in self.embeddings]
        return out + [("domain", name) for name in sorted(self.referenced_domains)]

    def kinds(self) -> list[str]:
        return sorted({kind for kind, _ in self.signal_keys()})

    def bundle(self, text: str) -> bytes:
        """The request's bundle: its text's embedding (and the cached texts while not cached)."""
        tasks: list[dict[str, Any]] = [{"id": TASK_QUERY, "embeddings": _embed([text])}]
        if not self.cached:
            tasks.append({"id": TASK_CANDIDATES, "embeddings": _embed(self.texts)})
        return json.dumps({"tasks": tasks}, ensure_ascii=False).encode()

    def warm_bundle(self) -> bytes | None:
        """What fills the cache before the first request, or None when it is full."""
        if self.cached:
            return None
        return json.dumps(
            {"tasks": [{"id": TASK_CANDIDATES, "embeddings": _embed(self.texts)}]}
        ).encode()

    def read(self, body: bytes, *, warm: bool = False) -> dict[SignalKey, SignalResult]:
        """A bundle answer -> the deployment's signal results (caches the texts' embeddings
        it carries). A ``warm`` answer (to :meth:`warm_bundle`) only fills the cache."""
        results = _results_by_id(self.deployment, body)
        if TASK_CANDIDATES in results:
            self.take(_vectors(self.deployment, results[TASK_CANDIDATES]))
        if warm:
            return {}
        if TASK_QUERY not in results or self.candidates is None:
            raise SignalAnswerError(
                f"deployment {self.deployment!r} answered the routing bundle without the "
                "embeddings it was asked for"
            )
        query = _vectors(self.deployment, results[TASK_QUERY])[0]
        out: dict[SignalKey, SignalResult] = {}
        for sig in self.embeddings:
            out[("embedding", sig.name)] = embedding_result(sig, query, self.candidates[sig.name])
        if self.referenced_domains and self.centroids is not None:
            names = [name for name, _ in self.label_key]
            (row,) = classify.by_centroids(normalize_rows(query), self.centroids, names)
            for name, res in domain_results(
                self.domains, row["label"], row["probabilities"]
            ).items():
                if name in self.referenced_domains:
                    out[("domain", name)] = res
        return out

    def take(self, vectors: numpy.ndarray) -> None:
        if vectors.shape[0] != len(self.texts):
            raise SignalAnswerError(
                f"deployment {self.deployment!r} returned {vectors.shape[0]} embeddings for "
                f"{len(self.texts)} texts"
            )
        normed = normalize_rows(vectors)
        if self.label_key:
            first = sum(sl.stop - sl.start for sl in self.slices.values())
            # As the worker's classify does: from the examples' embeddings as they came.
            self.centroids = classify.centroids_from(vectors[first:], self.label_key)
        self.candidates = {name: normed[sl] for name, sl in self.slices.items()}


def _embed(texts: list[str]) -> dict[str, Any]:
    return {"input": texts, "encoding_format": "base64", "truncate": True}


def _results_by_id(deployment: str, body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
        results = doc["results"]
        by_id = {r["id"]: r for r in results}
    except (ValueError, KeyError, TypeError) as exc:
        raise SignalAnswerError(
            f"deployment {deployment!r} answered the routing bundle with no results ({exc})"
        ) from None
    out = {}
    for task_id, res in by_id.items():
        if res.get("status") != 200:
            err = (res.get("body") or {}).get("error") or {}
            raise SignalAnswerError(
                f"deployment {deployment!r} refused routing task {task_id!r}: "
                f"{err.get('code', res.get('status'))}: {err.get('message', '')}",
                task=task_id,
                task_code=err.get("code"),
            )
        out[task_id] = res["body"]
    return out


def _vectors(deployment: str, body: Any) -> numpy.ndarray:
    try:
        rows = [item["embedding"] for item in body["data"]]
        if rows and isinstance(rows[0], str):
            decoded = [numpy.frombuffer(base64.b64decode(r), dtype=numpy.float32) for r in rows]
            return numpy.stack(decoded)
        return numpy.asarray(rows, dtype=numpy.float32)
    except (KeyError, TypeError, ValueError) as exc:
        raise SignalAnswerError(f"deployment {deployment!r}: bad embeddings ({exc})") from None


class QuestionPlan:
    """What one config generation asks: the referenced keyword matchers, and per deployment the
    referenced embedding signals and domain label set (with their caches)."""

    def __init__(
        self, routing: Routing, decision_deployment: str, wanted: set[SignalKey] | None = None
    ) -> None:
        self.referenced: set[SignalKey] = (
            set(wanted)
            if wanted is not None
            else {key for dec in routing.decisions for key in leaves(dec.rules)}
        )
        sigs = routing.signals
        self.keywords: dict[str, KeywordMatcher] = {
            s.name: keyword_matcher(s)
            for s in sigs.keywords
            if ("keyword", s.name) in self.referenced
        }
        embeddings: dict[str, list[EmbeddingSignal]] = {}
        for e in sigs.embeddings:
            if ("embedding", e.name) in self.referenced:
                embeddings.setdefault(e.deployment or decision_deployment, []).append(e)
        domains: dict[str, list[DomainSignal]] = {}
        for d in sigs.domains:
            domains.setdefault(d.deployment or decision_deployment, []).append(d)
        self.deployments: dict[str, DeploymentQuestions] = {}
        for dep in sorted(set(embeddings) | set(domains)):
            referenced = frozenset(
                d.name for d in domains.get(dep, []) if ("domain", d.name) in self.referenced
            )
            if not embeddings.get(dep) and not referenced:
                continue  # only unreferenced domains there: nothing to ask
            self.deployments[dep] = DeploymentQuestions(
                dep, embeddings.get(dep, []), domains.get(dep, []) if referenced else [], referenced
            )

    def keyword_results(self, text: str) -> dict[SignalKey, SignalResult]:
        return {("keyword", name): m.score(text) for name, m in self.keywords.items()}


def declared_keys(routing: Routing) -> set[SignalKey]:
    """Every declared signal of the families we evaluate, as rule leaves name them (for
    /api/v1/eval, which runs them all)."""
    sigs = routing.signals
    keys: set[SignalKey] = set()
    for kind, items in (
        ("keyword", sigs.keywords),
        ("embedding", sigs.embeddings),
        ("domain", sigs.domains),
        ("context", sigs.context),
        ("structure", sigs.structure),
        ("conversation", sigs.conversation),
        ("language", sigs.language),
        ("metadata", sigs.metadata),
    ):
        keys |= {(kind, s.name) for s in items}
    keys |= {("authz", b.role) for b in sigs.role_bindings}
    return keys


def request_text(messages: Any) -> str:
    """The last user message's text (the text parts of a multi-part content, joined by a
    newline); "" when there is none."""
    if not isinstance(messages, list):
        return ""
    for msg in reversed(messages):
        if not isinstance(msg, dict) or msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            parts = [
                p["text"]
                for p in content
                if isinstance(p, dict)
                and p.get("type") == "text"
                and isinstance(p.get("text"), str)
            ]
            return "\n".join(parts)
        return ""
    return ""
