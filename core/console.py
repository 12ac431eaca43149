"""The one way polyspec makes a rich Console for tables.

Logs, pipes and CI are not terminals: rich would then assume 80 columns and squeeze a wide table until
its columns read "pos…" and "0.5…". Off a terminal, tables get a fixed width wide enough for every
table polyspec prints; on a terminal, rich measures it.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

PIPE_WIDTH = 160


def console(*, stderr: bool = False, **kwargs: Any) -> Any:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPE_WIDTH
    return Console(stderr=stderr, width=width, **kwargs)
