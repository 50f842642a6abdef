"""A time budget: parsed from what a user types, counted from the moment the process started."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path


def parse_budget(text: str | int | float | None) -> float | None:
    """'5min', '300s', '1.5h', '90' (seconds), Lightning's 'DD:HH:MM:SS' or a {'minutes': 5} dict -> seconds."""
    if text is None or text == "":
        return None
    if isinstance(text, dict):
        from datetime import timedelta

        return timedelta(**text).total_seconds()
    if isinstance(text, int | float):
        seconds = float(text)
    elif re.fullmatch(r"\d+:\d+:\d+:\d+", str(text)):
        d, h, m, s = (int(x) for x in str(text).split(":"))
        seconds = ((d * 24 + h) * 60 + m) * 60 + s
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|seconds?|m|min|mins|minutes?|h|hr|hours?)?\s*", str(text))
        if not m:
            raise ValueError(f"budget={text!r}: expected a duration such as 300s, 5min or 1.5h")
        unit = (m.group(2) or "s")[0]
        seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[unit]
    if seconds <= 0:
        raise ValueError(f"budget={text!r} must be positive")
    return seconds


def process_start() -> float:
    """time.time() when this process started (Linux /proc), so a budget counts the imports too; elsewhere: now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
