"""Previews of calls still streaming, for a UI; never executable (public namespace:
re-exports only).

A :class:`PreviewPolicy` (a :class:`ToolPreview` per tool) turns previews on; each
:class:`PreviewUpdated` carries :class:`PathDelta` values from a :class:`PartialJSON`, the
incremental parser that does linear work in the argument size.
"""

from .core._partial_json import PartialJSON, PathDelta
from .core._preview import PreviewPolicy, PreviewUpdated, ToolPreview

__all__ = ["PartialJSON", "PathDelta", "PreviewPolicy", "PreviewUpdated", "ToolPreview"]
