"""Upstream's Responses API (``/v1/responses``) in Router mode: a request is translated to a
chat completion (``translate``), routed and answered like any chat, and the backend's answer is
translated back into a Response object, or, streamed, into the Responses event stream
(``events``); responses are kept in a store (``store``: memory; ``redis_store``) so a later
request can chain onto one with ``previous_response_id``. ``api`` holds the HTTP handlers."""
