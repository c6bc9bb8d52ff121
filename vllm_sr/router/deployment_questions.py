"""What one request asks one deployment, and reading its answer: the deployment's one routing
bundle (``POST /v1/bundle``) with its ``query`` task (the request's texts) and, once per config
generation, its ``candidates`` task (embedding candidates, domain examples, the families'
banks); the answer's rows become signal results here. ``questions`` builds one of these per
deployment from the config (:class:`~vllm_sr.router.questions.QuestionPlan`) and says why
the bundle has this shape.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy

from vllm_sr.config.routing_signals import DomainSignal, EmbeddingSignal
from vllm_sr.errors import VllmSrError
from vllm_sr.jsontypes import JsonObject, json_object
from vllm_sr.router import bundle
from vllm_sr.router.bundle import BUNDLE_PATH as BUNDLE_PATH  # route.py reads it from here
from vllm_sr.router.embedding_matching import EmbeddingMatching, embedding_score
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.rules import SignalKey
from vllm_sr.router.signals import FloatArray, SignalResult, domain_result, normalize_rows
from vllm_sr.router.signals_builtin import MMLU_EXAMPLES
from vllm_sr.router.signals_embedded import EmbeddedFamilies
from vllm_sr.router.signals_heads import TASK_CLASSIFY, Heads
from vllm_sr.router.signals_prototypes import PrototypeBank
from vllm_sr.router.unknown import Unknown, unknown_of_error
from vllm_sr.worker import classify
from vllm_sr.worker.classify import LabelKey

if TYPE_CHECKING:
    from vllm_sr.router.family_deployment import DeploymentAsk

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
    families: EmbeddedFamilies | None = None  # the embedding-only families (decision deployment)
    heads: Heads | None = None  # signals its classification head answers
    # embedding_config's scoring (prototype banks of the candidates)
    matching: EmbeddingMatching = field(default_factory=EmbeddingMatching)
    # bound deployment families' asks (families.DEPLOYMENT_BUILDERS)
    asks: list[DeploymentAsk] = field(default_factory=list)
    # Embedded once per config generation: the candidates, the domains' examples, the
    # families' example banks.
    texts: list[str] = field(default_factory=list)
    slices: dict[str, slice[int, int, None]] = field(default_factory=dict)
    label_key: LabelKey = ()
    # Normalised candidate embeddings per signal, and the domain centroids, once known.
    candidates: dict[str, FloatArray] | None = None
    centroids: FloatArray | None = None
    banks: dict[str, PrototypeBank] = field(default_factory=dict)  # per embedding signal
    _kinds: list[str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        for sig in self.embeddings:
            self.slices[sig.name] = slice(len(self.texts), len(self.texts) + len(sig.candidates))
            self.texts.extend(sig.candidates)
        self.label_key = tuple((d.name, tuple(domain_examples(d))) for d in self.domains)
        self._domain_names = [name for name, _ in self.label_key]
        # Each referenced domain's column in the classification (the last of a repeated
        # name, as a dict of the label probabilities keeps it).
        column = {name: i for i, name in enumerate(self._domain_names)}
        self._referenced_at = [
            (d, column[d.name]) for d in self.domains if d.name in self.referenced_domains
        ]
        self._examples = slice(
            len(self.texts), len(self.texts) + sum(len(e) for _, e in self.label_key)
        )
        for _, examples in self.label_key:
            self.texts.extend(examples)
        banks = self.families.bank_texts() if self.families is not None else []
        self._banks = slice(len(self.texts), len(self.texts) + len(banks))
        self.texts.extend(banks)
        if not self.texts:  # e.g. reasks alone: nothing to embed ahead of the requests
            self.take(numpy.zeros((0, 1), dtype=numpy.float32))

    @property
    def embeds(self) -> bool:
        """Whether a request's text is embedded here (else only the head is asked)."""
        shared = any(ask.shares_query for ask in self.asks)
        return bool(
            self.embeddings or self.referenced_domains or self.families is not None or shared
        )

    @property
    def cached(self) -> bool:
        return self.candidates is not None

    @property
    def heavy(self) -> bool:
        """Whether reading an answer costs the loop more than handing it to a signal process
        (measured with bench/router_signals.py: the embedding-only families score a few dozen
        prototype banks, 0.25-0.35 ms a chat; a few embedding signals or domains read in tens
        of microseconds, less than a hand-off). Such an answer still goes along when the
        chat's CPU-bound step is handed off anyway."""
        return self.families is not None

    def signal_keys(self) -> list[SignalKey]:
        """The signals this deployment answers (for per-signal errors when it fails)."""
        out: list[SignalKey] = [("embedding", s.name) for s in self.embeddings]
        out += [("domain", name) for name in sorted(self.referenced_domains)]
        out += self.families.signal_keys() if self.families is not None else []
        out += self.heads.signal_keys() if self.heads is not None else []
        return out + [key for ask in self.asks for key in ask.signal_keys()]

    def kinds(self) -> list[str]:
        """The signal families answered here (KB metric values are not a family); fixed for
        the generation, so worked out once (every chat's timings read it)."""
        if self._kinds is None:
            self._kinds = sorted({kind for kind, _ in self.signal_keys() if kind != "kb_metric"})
        return self._kinds

    def query_texts(self, text: str, view: RequestView | None = None) -> list[str]:
        """What the request's ``query`` task embeds: its text first, then (deduplicated) the
        turns the families read."""
        out = [text]
        if self.families is not None and view is not None:
            for t in self.families.query_texts(view):
                if t not in out:
                    out.append(t)
        return out

    def bundle(self, text: str, view: RequestView | None = None) -> bytes:
        """The request's bundle: its texts' embeddings (and the cached texts while not
        cached). With the ``view``, the text embedded is upstream's sample of it (whole up to
        2048 characters, else its first, middle and last thirds)."""
        tasks: list[JsonObject] = []
        if self.embeds:
            query = self.query_texts(view.sampled_text() if view is not None else text, view)
            tasks.append(bundle.embed_task(TASK_QUERY, query))
        if self.heads is not None:
            tasks.append(self.heads.task(view or RequestView(text=text)))
        for ask in self.asks:
            tasks.extend(ask.tasks(view or RequestView(text=text)))
        if not self.cached:
            tasks.append(bundle.embed_task(TASK_CANDIDATES, self.texts))
        return bundle.request(tasks)

    def warm_bundle(self) -> bytes | None:
        """What fills the cache before the first request, or None when it is full."""
        if self.cached:
            return None
        return bundle.request([bundle.embed_task(TASK_CANDIDATES, self.texts)])

    def read(
        self, body: bytes, *, warm: bool = False, view: RequestView | None = None
    ) -> dict[SignalKey, SignalResult]:
        """A bundle answer -> the deployment's signal results (caches the texts' embeddings
        it carries). A ``warm`` answer (to :meth:`warm_bundle`) only fills the cache. ``view``
        is the request the bundle was made for (:meth:`bundle`)."""
        results = _results_by_id(self.deployment, body)
        if TASK_CANDIDATES in results:
            self.take(_vectors(self.deployment, results[TASK_CANDIDATES]))
        if warm:
            return {}
        out: dict[SignalKey, SignalResult] = {}
        if self.heads is not None:
            out.update(self._head_results(results, view))
        for ask in self.asks:
            try:
                out.update(ask.results(results, view or RequestView(text="")))
            except ValueError as exc:
                raise SignalAnswerError(
                    f"deployment {self.deployment!r} answered the routing bundle without what "
                    f"the {ask.family} family asked ({exc})"
                ) from None
        if not self.embeds:
            return out
        if TASK_QUERY not in results or self.candidates is None:
            raise SignalAnswerError(
                f"deployment {self.deployment!r} answered the routing bundle without the "
                "embeddings it was asked for"
            )
        rows = _vectors(self.deployment, results[TASK_QUERY])
        texts = self.query_texts(view.sampled_text(), view) if view is not None else [""]
        if rows.shape[0] != len(texts):
            raise SignalAnswerError(
                f"deployment {self.deployment!r} returned {rows.shape[0]} query embeddings for "
                f"{len(texts)} texts"
            )
        normed = normalize_rows(rows)  # (row by row: the same as normalising each alone)
        if self.embeddings:
            for sig in self.embeddings:
                bank = self.banks[sig.name]
                out[("embedding", sig.name)] = embedding_score(sig, bank, normed[0])
        if self.referenced_domains and self.centroids is not None:
            self._domain_results(normed[:1], out)
        if self.families is not None and view is not None:
            by_text = {t: normed[i] for i, t in enumerate(texts)}
            out.update(self.families.results(view, by_text.__getitem__, texts[0]))
        return out

    def _domain_results(self, normed: FloatArray, out: dict[SignalKey, SignalResult]) -> None:
        """The referenced domains' results for the (normalised) text: the classification's
        top label and each referenced domain's probability
        (:func:`classify.centroid_probabilities`), read by column, to
        :func:`signals.domain_result` (the others' are not worked out: they would be dropped)."""
        assert self.centroids is not None
        probs = classify.centroid_probabilities(normed, self.centroids)[0]
        label = self._domain_names[int(probs.argmax())]
        row = probs.tolist()
        for dom, at in self._referenced_at:
            out[("domain", dom.name)] = domain_result(dom, label, row[at])

    def _head_results(
        self, results: dict[str, object], view: RequestView | None
    ) -> dict[SignalKey, SignalResult]:
        assert self.heads is not None
        view = view or RequestView(text="")
        try:
            answer = json_object(results.get(TASK_CLASSIFY))
            rows = answer.get("data") if answer is not None else None
            if not isinstance(rows, list):
                raise ValueError("no classify data")
            if len(rows) != len(self.heads.texts(view)):
                raise ValueError(f"{len(rows)} rows for {len(self.heads.texts(view))} texts")
            return self.heads.results(view, rows)
        except ValueError as exc:
            raise SignalAnswerError(
                f"deployment {self.deployment!r} answered the routing bundle without the "
                f"classification it was asked for ({exc})"
            ) from None

    def take(self, vectors: FloatArray) -> None:
        if vectors.shape[0] != len(self.texts):
            raise SignalAnswerError(
                f"deployment {self.deployment!r} returned {vectors.shape[0]} embeddings for "
                f"{len(self.texts)} texts"
            )
        normed = normalize_rows(vectors)
        if self.label_key:
            # As the worker's classify does: from the examples' embeddings as they came.
            self.centroids = classify.centroids_from(vectors[self._examples], self.label_key)
        if self.families is not None:
            self.families.take(normed[self._banks])
        self.candidates = {name: normed[sl] for name, sl in self.slices.items()}
        self.banks = {
            sig.name: self.matching.bank(sig, self.candidates[sig.name]) for sig in self.embeddings
        }


@dataclass(frozen=True)
class AnswerRead:
    """One deployment's routing bundle answer read into its signal results, or why it could
    not be (its signals are then all unknown), and the milliseconds reading took."""

    results: dict[SignalKey, SignalResult]
    unknown: Unknown | None
    read_ms: float


def read_answer(q: DeploymentQuestions, body: bytes, view: RequestView) -> AnswerRead:
    """:meth:`DeploymentQuestions.read` of a 200 answer, its failure kept as the signals'
    unknown state (on the loop and in a signal process alike: the same results)."""
    started = time.perf_counter()
    try:
        results = q.read(body, view=view)
        why = None
    except Exception as exc:  # a malformed answer, or a bug: this deployment's signals only
        why = unknown_of_error(q.deployment, exc)
        results = {key: SignalResult.unknown_because(why) for key in q.signal_keys()}
    return AnswerRead(results, why, (time.perf_counter() - started) * 1000.0)


def domain_examples(dom: DomainSignal) -> list[str]:
    """A domain's example texts: its own, plus our built-in examples of its
    ``mmlu_categories`` when it gives no ``examples``."""
    out = dom.label_examples()
    if not dom.examples:
        for cat in dom.mmlu_categories:
            out += list(MMLU_EXAMPLES.get(cat, ()))
    return out


def _results_by_id(deployment: str, body: bytes) -> dict[str, object]:
    """Every task's body; a refused task or an unreadable answer fails the deployment's
    signals."""
    try:
        results = bundle.decode(body)
    except bundle.BundleAnswerError as exc:
        raise SignalAnswerError(
            f"deployment {deployment!r} answered the routing bundle with {exc}"
        ) from None
    out = {}
    for task_id, res in results.items():
        if not res.ok:
            err = res.error()
            raise SignalAnswerError(
                f"deployment {deployment!r} refused routing task {task_id!r}: "
                f"{err.get('code', res.status)}: {err.get('message', '')}",
                task=task_id,
                task_code=err.get("code"),
            )
        out[task_id] = res.body
    return out


def _vectors(deployment: str, body: object) -> FloatArray:
    try:
        return bundle.embeddings(body)
    except bundle.BundleAnswerError as exc:
        raise SignalAnswerError(f"deployment {deployment!r}: {exc}") from None
