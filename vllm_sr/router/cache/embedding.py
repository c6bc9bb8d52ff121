"""The query embedding the semantic cache compares: the one routing already computed, else one
exchange.

Routing asks each deployment ONE bundle per chat whose task ``query`` is the request text's
embedding (vllm_sr/router/questions.py); the signals keep each deployment's answer
(``SignalRun.answers``) and the chat's pipeline hands the decision deployment's to its
:class:`QueryEmbedding` (on the chat's ``ChatRun``, vllm_sr/router/pipeline.py), whose
:meth:`QueryEmbedding.vector` reads the ``query`` task's embedding from it. So when an embedding
or domain signal runs on the decision deployment, the cache costs no exchange. When none ran
(keyword-only decisions, or signals on other deployments), :meth:`QueryEmbedding.vector` asks
the decision deployment ONE bundle with the same ``query`` task routing would have sent (same
text, same model), so entries from both paths compare. Embeddings from other deployments are
never used: another model's vectors do not compare with the decision deployment's."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr.errors import VllmSrError
from vllm_sr.router import bundle
from vllm_sr.router.bundle import BUNDLE_PATH
from vllm_sr.router.cache.store import Vector

if TYPE_CHECKING:
    from vllm_sr.router.route import Exchange

log = logging.getLogger("vllm_sr.router.cache")

QUERY_TASK = "query"


@dataclass
class QueryEmbedding:
    """One chat's query embedding: the tapped routing answer, or one exchange on demand."""

    deployment: str
    text: str = ""
    answer: bytes | None = None  # the decision deployment's routing bundle answer, if any
    exchanges: int = 0  # exchanges made here (0 when routing's answer was reused)
    reused: bool = False
    _vector: Vector | None = field(default=None, repr=False)

    async def vector(self, exchange: Exchange, timeout_ms: float | None) -> Vector | None:
        """The text's embedding; None when it cannot be had (the cache then skips the semantic
        tier for this chat)."""
        if self._vector is not None:
            return self._vector
        if self.answer is not None:
            self._vector = query_vector(self.answer)
            if self._vector is not None:
                self.reused = True
                return self._vector
        if not self.text.strip():
            return None
        body = bundle.request([bundle.embed_task(QUERY_TASK, [self.text])])
        self.exchanges += 1
        try:
            status, answer = await exchange(self.deployment, BUNDLE_PATH, body, timeout_ms)
        except VllmSrError as exc:
            log.info("cache embedding on %s failed: %s", self.deployment, exc.message)
            return None
        if status != 200:
            return None
        self._vector = query_vector(answer)
        return self._vector


def query_vector(answer: bytes) -> Vector | None:
    """The ``query`` task's first embedding in a bundle answer, or None."""
    rows = bundle.task_embeddings(answer, QUERY_TASK)
    return rows[0] if rows else None
