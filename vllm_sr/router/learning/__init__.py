"""Upstream's Router Learning in Router mode: protection (a conversation stays on its model)
and adaptation (routing_sampling over the decision's models, learning from what the backends'
answers show). Pure parts: ``settings`` (effective modes and tuning), ``memory`` (conversation
state on a clock), ``protection``, ``adaptation``, ``policy`` (what the headers say), ``facts``
(what is read of a chat and a router); ``state`` is what one process keeps across reloads,
``shared_store`` the redis state store, and ``runtime`` the glue around one chat."""
