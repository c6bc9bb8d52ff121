"""The one JSON body parser (vllm_sr.jsonbody): typed errors naming what was wrong and the
model's refusals by field. The size cap and the read timeout are the server's
(tests/unit/test_httpserver.py; on the control socket, tests/unit/test_control_server.py)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from vllm_sr import jsonbody
from vllm_sr.errors import InvalidRequest


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    replicas: StrictInt = Field(ge=0)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xff{}", "body: not UTF-8 (bad byte at offset 0)"),
        (b"{nope", "body: not valid JSON"),
        (b"[1]", "body: expected a JSON object, got array"),
        (b'"x"', "body: expected a JSON object, got string"),
        (b"", "body: not valid JSON"),
        (b'{"replicas": "2"}', "replicas: Input should be a valid integer (got '2')"),
        (b'{"replicas": 1, "x": 0}', "x: unknown field"),
    ],
)
def test_parse_refusals_name_what_was_wrong(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        jsonbody.parse_json(raw, Body)
    assert info.value.message.startswith(message)


def test_parse_returns_the_dict_or_the_model() -> None:
    assert jsonbody.parse_json(b'{"a": [1]}') == {"a": [1]}
    assert jsonbody.parse_json(b" ", allow_empty=True) == {}
    assert jsonbody.parse_json(b'{"replicas": 3}', Body).replicas == 3
