"""The assembler and the commit gate (public namespace: re-exports only).

:class:`Assembler` applies stream events to one bounded buffer per call and returns
:data:`CallUpdate` values while the round streams (a :class:`CallFailed`, a
:class:`CallReady` for an eager call that may start now, a ``PreviewUpdated`` when previews
are on, and with ``observe=True`` :class:`TextReceived`, :class:`CallAnnounced` and
:class:`CallComplete`; a :class:`RoundOver` when a size limit ended the round);
``finish()`` decides every call once through the :class:`Gate` and returns the ``Round``.
``Gate.check`` returns a ``CommittedCall`` or a :class:`Rejection`; a :data:`Policy`
returns a :data:`PolicyDecision`.
"""

from .core._assembler import (
    Assembler,
    CallAnnounced,
    CallComplete,
    CallFailed,
    CallReady,
    CallUpdate,
    RoundOver,
    TextReceived,
)
from .core._gate import Gate, Policy, PolicyDecision, Rejection

__all__ = [
    "Assembler",
    "CallAnnounced",
    "CallComplete",
    "CallFailed",
    "CallReady",
    "CallUpdate",
    "Gate",
    "Policy",
    "PolicyDecision",
    "Rejection",
    "RoundOver",
    "TextReceived",
]
