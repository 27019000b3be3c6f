"""The sans-IO core: wire decoders, adapters, the assembler and its buffers, the
gate, previews and partial JSON, call states, rounds, history builders, limits and
errors. No sockets, no asyncio, no clocks; it imports no other room. Its modules are
private: the public names are re-exported by ``toollatch`` (what a user needs) and
``toollatch.stages`` (the stages, for callers who own the loop). See docs/ARCHITECTURE.md."""
