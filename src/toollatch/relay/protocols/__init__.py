"""Other event formats the relay speaks besides its own (internal): each is a view over a
run's event log (:class:`~toollatch.relay._runs.EventLog`), one producer, several encoders.
``_ui_message``: the Vercel AI SDK's UI message stream (``POST /api/chat``)."""
