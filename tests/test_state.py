"""The call state table: allowed transitions, every forbidden pair, and who may assign state."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from toollatch import CallState, ErrorCode, InvariantBroken
from toollatch.core._buffer import CallBuffer
from toollatch.core._state import TERMINAL, TRANSITIONS, Trigger, advance
from toollatch.stages import CallKey

SRC = Path(__file__).resolve().parents[1] / "src" / "toollatch"


OPEN, DONE_ARGS, COMMITTED, FAILED, CANCELLED = (
    CallState.OPEN,
    CallState.ARGS_COMPLETE,
    CallState.COMMITTED,
    CallState.FAILED,
    CallState.CANCELLED,
)
LIVES = [  # every life a call can have, written out (the spec the table must meet)
    (OPEN, Trigger.CLOSE, DONE_ARGS, Trigger.ACCEPT, COMMITTED),
    # an eager call committed early, then the round fails or is cancelled: it may be running
    (
        OPEN,
        Trigger.CLOSE,
        DONE_ARGS,
        Trigger.ACCEPT,
        COMMITTED,
        Trigger.FAIL,
        COMMITTED,
        Trigger.CANCEL,
        COMMITTED,
    ),
    (OPEN, Trigger.CLOSE, DONE_ARGS, Trigger.FAIL, FAILED),
    (OPEN, Trigger.CLOSE, DONE_ARGS, Trigger.CANCEL, CANCELLED),
    (OPEN, Trigger.FAIL, FAILED, Trigger.FAIL, FAILED, Trigger.CANCEL, FAILED),
    (OPEN, Trigger.CANCEL, CANCELLED, Trigger.FAIL, CANCELLED, Trigger.CANCEL, CANCELLED),
]


@pytest.mark.parametrize("life", LIVES)
def test_every_life_of_a_call(life):
    state = life[0]
    for trigger, expected in zip(life[1::2], life[2::2], strict=True):
        state = advance(state, trigger)
        assert state is expected


def test_the_table_allows_exactly_the_written_lives():
    steps = {(life[i], life[i + 1]) for life in LIVES for i in range(0, len(life) - 1, 2)}
    assert steps == set(TRANSITIONS)


FORBIDDEN = [p for p in itertools.product(CallState, Trigger) if p not in TRANSITIONS]


@pytest.mark.parametrize(("state", "trigger"), FORBIDDEN)
def test_every_forbidden_pair_raises(state, trigger):
    with pytest.raises(InvariantBroken):
        advance(state, trigger)


def test_terminal_states_have_no_way_out_and_transitions_are_one_way():
    order = list(CallState)
    for (state, trigger), target in TRANSITIONS.items():
        if state in TERMINAL:
            assert target is state, (state, trigger)  # a listed no-op: the first outcome stays
        else:
            assert order.index(target) > order.index(state), (state, target)
    assert {s for s, _ in TRANSITIONS} | TERMINAL == set(CallState)  # no state is unreachable


@pytest.mark.parametrize("first", ["fail", "cancel"])
@pytest.mark.parametrize("then", ["fail", "cancel"])
def test_a_decided_call_keeps_its_first_outcome(first, then):
    buf = CallBuffer(CallKey(0, 0, 0), 0, "a", "f")
    for step, detail in ((first, "first"), (then, "then")):
        if step == "fail":
            buf.fail(ErrorCode.TRUNCATED, detail)
        else:
            buf.cancel(detail)
    assert buf.detail == "first"
    assert buf.state is (CallState.FAILED if first == "fail" else CallState.CANCELLED)


def test_only_the_state_module_and_the_buffer_assign_a_state():
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.relative_to(SRC).as_posix() in {"core/_state.py", "core/_buffer.py"}:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Attribute) and t.attr == "state":
                        offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
