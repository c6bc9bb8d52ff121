"""The questions a request asks the deployments, and their answers as signal inputs.

Only signals some decision references are evaluated. Per deployment, one request asks ONE
bundle (``POST /v1/bundle``, see vllm_sr/worker/surfaces.py):

- task ``query``: the request text's embedding (base64 float32), when an embedding signal on
  the deployment is referenced;
- task ``domains``: a classification of the request text with ``labels`` = every domain on
  the deployment ({name: [description, *examples]}), when one of them is referenced. The worker
  caches each label set's centroids (``CentroidCache``), so the examples are embedded once per
  worker, not per request;
- task ``candidates``: the embedding signals' candidate phrases, only while the router has not
  cached them yet for this config generation (the first request, or :meth:`warm_bundle`).

Texts are sent with ``truncate: true``: a long prompt is routed on its first tokens rather than
refused.
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

BUNDLE_PATH = "/v1/bundle"
TASK_QUERY = "query"
TASK_DOMAINS = "domains"
TASK_CANDIDATES = "candidates"
WARM_TEXT = "warm-up"


class SignalAnswerError(VllmSrError):
    """A deployment answered the routing bundle, but not with what the router asked for."""

    code = "bad_signal_answer"
    http_status = 502
    retryable = True


@dataclass
class DeploymentQuestions:
    deployment: str
    embeddings: list[EmbeddingSignal]
    domains: list[DomainSignal]  # the deployment's whole label set
    referenced_domains: frozenset[str]
    labels: dict[str, list[str]] = field(default_factory=dict)
    candidate_texts: list[str] = field(default_factory=list)
    slices: dict[str, slice] = field(default_factory=dict)
    # The candidates' normalised embeddings per signal, once known (this config generation).
    candidates: dict[str, numpy.ndarray] | None = None

    def __post_init__(self) -> None:
        self.labels = {d.name: d.label_examples() for d in self.domains}
        start = 0
        for sig in self.embeddings:
            self.slices[sig.name] = slice(start, start + len(sig.candidates))
            self.candidate_texts.extend(sig.candidates)
            start += len(sig.candidates)
        if not self.embeddings:
            self.candidates = {}

    @property
    def asks_domains(self) -> bool:
        return bool(self.referenced_domains)

    def bundle(self, text: str) -> bytes:
        """The request's bundle (with the candidates while they are not cached)."""
        tasks: list[dict[str, Any]] = []
        if self.embeddings:
            tasks.append({"id": TASK_QUERY, "embeddings": _embed([text])})
        if self.asks_domains:
            tasks.append({"id": TASK_DOMAINS, "classify": self._classify(text)})
        if self.candidates is None:
            tasks.append({"id": TASK_CANDIDATES, "embeddings": _embed(self.candidate_texts)})
        return json.dumps({"tasks": tasks}, ensure_ascii=False).encode()

    def warm_bundle(self) -> bytes | None:
        """What fills both caches before the first request: the candidates' embeddings (kept by
        the router) and the domains' centroids (kept by the worker that answers)."""
        tasks: list[dict[str, Any]] = []
        if self.candidates is None:
            tasks.append({"id": TASK_CANDIDATES, "embeddings": _embed(self.candidate_texts)})
        if self.asks_domains:
            tasks.append({"id": TASK_DOMAINS, "classify": self._classify(WARM_TEXT)})
        return json.dumps({"tasks": tasks}).encode() if tasks else None

    def _classify(self, text: str) -> dict[str, Any]:
        return {"input": [text], "labels": self.labels, "truncate": True}

    def read(self, body: bytes, *, warm: bool = False) -> dict[SignalKey, SignalResult]:
        """A bundle answer -> the deployment's signal results (caches candidates it carries).
        A ``warm`` answer (to :meth:`warm_bundle`) only fills the cache."""
        results = _results_by_id(self.deployment, body)
        if TASK_CANDIDATES in results:
            self.take_candidates(_vectors(self.deployment, results[TASK_CANDIDATES]))
        out: dict[SignalKey, SignalResult] = {}
        if warm:
            return out
        if self.embeddings and (TASK_QUERY not in results or self.candidates is None):
            raise SignalAnswerError(
                f"deployment {self.deployment!r} answered the routing bundle without the "
                "embeddings it was asked for"
            )
        if self.embeddings and self.candidates is not None:
            query = _vectors(self.deployment, results[TASK_QUERY])[0]
            for sig in self.embeddings:
                out[("embedding", sig.name)] = embedding_result(
                    sig, query, self.candidates[sig.name]
                )
        if TASK_DOMAINS in results:
            label, probs = _classification(self.deployment, results[TASK_DOMAINS])
            for name, res in domain_results(self.domains, label, probs).items():
                if name in self.referenced_domains:
                    out[("domain", name)] = res
        return out

    def take_candidates(self, vectors: numpy.ndarray) -> None:
        if vectors.shape[0] != len(self.candidate_texts):
            raise SignalAnswerError(
                f"deployment {self.deployment!r} returned {vectors.shape[0]} candidate "
                f"embeddings for {len(self.candidate_texts)} candidates"
            )
        normed = normalize_rows(vectors)
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


def _classification(deployment: str, body: Any) -> tuple[str, dict[str, float]]:
    try:
        row = body["data"][0]
        return str(row["label"]), {str(k): float(v) for k, v in row["probabilities"].items()}
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise SignalAnswerError(f"deployment {deployment!r}: bad classification ({exc})") from None


class QuestionPlan:
    """What one config generation asks: the referenced keyword matchers, and per deployment the
    referenced embedding signals and domain label set (with their caches)."""

    def __init__(self, routing: Routing, decision_deployment: str) -> None:
        self.referenced: set[SignalKey] = {
            key for dec in routing.decisions for key in leaves(dec.rules)
        }
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
                dep, embeddings.get(dep, []), domains.get(dep, []), referenced
            )

    def keyword_results(self, text: str) -> dict[SignalKey, SignalResult]:
        return {("keyword", name): m.score(text) for name, m in self.keywords.items()}


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
