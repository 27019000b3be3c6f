"""Frontends' protocols the relay speaks, each a view over the same runs and event log
(internal: the endpoints are the relay's, ``POST /agui`` and ``POST /api/chat``)."""

__all__: list[str] = []
