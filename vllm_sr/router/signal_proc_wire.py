"""The signal processes' wire: frames of a 4-byte big-endian length and a pickled tuple, over
a Unix socket pair the supervisor makes for each process (the child inherits its end by file
descriptor, so no socket file exists and no other process can connect; pickle is safe here
because both ends are this service's own processes).

Messages, parent -> child: ``("config", spec_id, spec_bytes)`` (a generation's
``CpuSignalSpec``) and ``("questions", spec_id, spec_bytes)`` (one deployment's
``DeploymentQuestions`` with its cached embeddings), each pickled once by the router and sent
once per connection before the first job that names it; and
``("job", job_id, spec_id, ViewFields, answers)`` (``spec_id`` 0: no CPU-bound family;
``answers``: ``(questions spec_id, answer bytes)`` pairs). Child -> parent: ``("ready", pid)``
once it has loaded presidio and lingua, then per job ``("ok", job_id, CpuReport)`` or
``("error", job_id, message)``.
"""

from __future__ import annotations

import pickle
import struct

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 64 * 1024 * 1024  # a chat's texts are capped far below this by the server


class FrameError(Exception):
    """A frame over the cap, or one that does not unpickle."""


def encode(message: tuple[object, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def encode_raw(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Bytes in, whole messages out (the parent's protocol feeds it from ``data_received``)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[object, ...]]:
        self._buf += data
        out: list[tuple[object, ...]] = []
        while len(self._buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf)
            if size > MAX_FRAME_BYTES:
                raise FrameError(f"frame of {size} bytes over the {MAX_FRAME_BYTES} cap")
            end = HEADER.size + size
            if len(self._buf) < end:
                break
            try:
                message = pickle.loads(bytes(self._buf[HEADER.size : end]))
            except Exception as exc:
                raise FrameError(f"a frame did not unpickle: {exc}") from exc
            del self._buf[:end]
            if not isinstance(message, tuple) or not message:
                raise FrameError(f"a frame is not a message tuple: {type(message).__name__}")
            out.append(message)
        return out
