"""Provider adapters: pure translators from native events to stream events (internal)."""
