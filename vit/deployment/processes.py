"""The processes vit-serve starts, and how they end: the launcher (the process that runs `vit-serve`) forks the API
servers and spawns the model workers (LitServe); each leaves the terminal's process group, so that Ctrl-C reaches the
launcher alone, and ends with the launcher however it ends; the launcher ends any that LitServe's own stop missed.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys


def leave_terminal_group() -> None:
    """This process into a process group of its own (same session): a terminal's Ctrl-C no longer reaches it; the
    launcher's shutdown (SIGTERM) still does."""
    try:
        os.setpgid(0, 0)
    except OSError:  # not permitted here (a session leader): it hears Ctrl-C as before
        pass


# prctl's option (linux/prctl.h): the signal this process gets when its parent ends
PR_SET_PDEATHSIG = 1


def die_with_launcher(launcher: int) -> None:
    """This process (an API server or model worker the launcher started) ends when the launcher ends, however it
    ends: a launcher killed (SIGKILL, the OOM killer) or stuck in its shutdown and killed left them running in their
    own process groups, holding the port, two API servers spinning at 90% of a core each. Linux only (prctl)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher:  # the launcher ended before the line above
        os._exit(1)


def stop_children(wait_s: float) -> None:
    """Every process this one started that still runs, ended: SIGTERM, `wait_s` seconds, then SIGKILL. LitServe stops
    the API servers it knows of, but a Ctrl-C that lands while it is still starting them (the first one already
    answers /health) leaves the rest unknown to it (LitServe's `_start_server` has not returned them), running in
    their own process groups, and the launcher's exit would wait for them for ever (multiprocessing joins its
    children at exit)."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(wait_s)
        if child.is_alive():
            child.kill()
            child.join()
