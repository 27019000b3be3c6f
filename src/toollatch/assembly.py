"""The assembler and the commit gate (public namespace: re-exports only).

:class:`Assembler` applies stream events to one bounded buffer per call and returns
:data:`CallUpdate` values while the round streams (a :class:`CallFailed`, or a
``PreviewUpdated`` when previews are on); ``finish()`` decides every call once through the
:class:`Gate` and returns the ``Round``. ``Gate.check`` returns a ``CommittedCall`` or a
:class:`Rejection`; a :data:`Policy` returns a :data:`PolicyDecision`.
"""

from ._assembler import Assembler, CallFailed, CallUpdate
from ._gate import Gate, Policy, PolicyDecision, Rejection

__all__ = ["Assembler", "CallFailed", "CallUpdate", "Gate", "Policy", "PolicyDecision", "Rejection"]
