"""``python -m toollatch.cli``: the ``toollatch`` command."""

from . import main

raise SystemExit(main())
