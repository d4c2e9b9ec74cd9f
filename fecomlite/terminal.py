"""Text from users and their programs, made safe to print with rich.

An API name, a region, a parameter, a CSV column or a file name is data, never markup: `[/]` must
print as itself (not raise MarkupError), `[link=...]` must not become a hyperlink, and escape
sequences must not reach the terminal (they could move the cursor or retitle the window).
"""

from __future__ import annotations

import re
from typing import Any

from rich.markup import escape

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # keeps \t and \n


def plain(value: Any) -> str:
    """`value` as text that rich prints literally: control characters dropped, markup escaped."""
    return escape(without_control(value))


def without_control(value: Any) -> str:
    """`value` as text without control characters (for output printed with markup off)."""
    return _CONTROL.sub("", str(value))
