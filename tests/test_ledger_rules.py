"""The ledger's rules as a property: any interleaving of claims, starts, renewals, finishes,
releases and settlements by several workers at arbitrary times keeps the fencing invariants.

- a write (start, renew, finish) succeeds only with the record's current token;
- a final record never changes again (its result is the first one stored);
- tokens only grow, and every Won carries a token larger than any seen before for the call;
- a ``started`` record is taken over only by a claim with ``rerun_started``.
"""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from toollatch import ToolResult
from toollatch.ledger import LeaseLost, LedgerKey, Won, digest_of
from toollatch.ledger._base import MemoryLedger

KEY = LedgerKey(scope="s", call_id="c")
DIGEST = digest_of("t", {})
OPS = st.lists(
    st.tuples(
        st.sampled_from(["claim", "claim_rerun", "start", "renew", "finish", "release", "settle"]),
        st.integers(0, 2),  # worker
        st.integers(0, 5),  # token guess offset
        st.floats(0, 1, allow_nan=False),  # time step
    ),
    max_size=40,
)


async def play(ops: list[tuple[str, int, int, float]]) -> None:
    ledger, now = MemoryLedger(), 0.0
    held: dict[int, int] = {}  # worker -> token it won
    highest, final = 0, None
    for op, worker, guess, step in ops:
        now += step
        before = await ledger.get(KEY)
        token = held.get(worker, guess)
        result = ToolResult(tool_call_id="c", name="t", content=f"{worker}@{now}")
        try:
            if op.startswith("claim"):
                claim = await ledger.claim(
                    KEY, digest=DIGEST, worker=str(worker), now=now, lease_s=0.5,
                    rerun_started=op == "claim_rerun",
                )  # fmt: skip
                if isinstance(claim, Won):
                    assert claim.token > highest
                    highest = claim.token
                    held[worker] = claim.token
                    if claim.previous is not None and claim.previous.state == "started":
                        assert op == "claim_rerun"
            elif op == "start":
                await ledger.start(KEY, token, now=now, lease_s=0.5)
            elif op == "renew":
                await ledger.renew(KEY, token, now=now, lease_s=0.5)
            elif op == "finish":
                await ledger.finish(KEY, token, result, now=now)
            elif op == "release":
                await ledger.release(KEY, token)
            else:
                await ledger.settle_unknown(KEY, token, result, now=now)
        except LeaseLost:
            assert (
                before is None
                or before.token != token
                or before.state in ("completed", "failed")
                or op == "start"
            )
            continue
        after = await ledger.get(KEY)
        if op in ("start", "renew", "finish"):
            assert before is not None
            assert before.token == token
        if final is not None:
            assert after == final  # a final record never changes
        if after is not None and after.state in ("completed", "failed"):
            final = after
        if after is not None:
            assert after.token <= highest


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_any_interleaving_keeps_the_fencing_rules(ops: list[tuple[str, int, int, float]]) -> None:
    asyncio.run(play(ops))
