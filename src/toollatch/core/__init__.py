"""The sans-IO core: wire decoders, adapters, the assembler and its buffers, the
gate, previews and partial JSON, call states, rounds, history builders, limits and
errors. No sockets, no asyncio, no clocks; it imports no other room. Its modules are
private: the public names are re-exported by ``toollatch`` and its facade modules
(``toollatch.assembly``, ``toollatch.events``...). See docs/ARCHITECTURE.md."""
