"""The ``ratings`` looper (upstream's ``RatingsLooper``): every modelRef answers the same
(tool-free) request at once, at most ``max_concurrent`` at a time; the final answer carries
one choice per model that answered, each naming its ``model``, in the modelRefs' order.
``on_error: skip`` leaves a failing model out, ``fail`` ends the loop with its failure; no
answer at all is a failure. The caller's deadline ends the round with the answers in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_sr.errors import DeadlineExceeded, Unavailable
from vllm_sr.router.looper.fanout import RoundSpec, content_of, tool_free
from vllm_sr.router.looper.runner import Loop, looper

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm_sr.config.looper_fanout_settings import RatingsSettings
    from vllm_sr.jsontypes import JsonObject


@looper("ratings")
async def run_ratings(
    loop: Loop, models: Sequence[str], body: JsonObject, settings: RatingsSettings
) -> None:
    result = loop.result
    spec = RoundSpec(max_concurrent=settings.max_concurrent, on_error=settings.on_error)
    done = await loop.round([(m, tool_free(body)) for m in models], spec)
    if not done.answers:
        if done.cut_short:
            raise DeadlineExceeded("the looper's deadline passed before any answer")
        reasons = "; ".join(f"{m}: {why}" for m, why in done.failures)
        raise Unavailable(f"ratings: every model failed ({reasons})")
    result.iterations = len(models)  # as upstream: every call made, failures too
    names = [got.model for got in done.answers]
    result.model = names[-1]
    result.answer = {
        "id": f"chatcmpl-looper-{done.answers[0].answer.get('id', 'ratings')}",
        "object": "chat.completion",
        "created": done.answers[0].answer.get("created", 0),
        "model": ",".join(names),
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": content_of(got.answer)},
                "finish_reason": "stop",
                "model": got.model,
            }
            for i, got in enumerate(done.answers)
        ],
    }
