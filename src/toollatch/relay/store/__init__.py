"""Run stores: where a relay keeps its runs' metadata, event logs and the chats' run
pointers (internal: ``toollatch serve --store``, ``RelayServer(store=...)``).

``memory:`` (the default) keeps them in the process, as one embedded relay needs;
``redis://HOST:PORT/DB`` shares them between workers (:mod:`._redis`, the ``redis``
extra, imported only when configured), so that any worker serves any run.
"""

__all__: list[str] = []
