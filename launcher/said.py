"""What a role says about itself besides its output, read from its output line by line.

Three speakers share a role's stdout and stderr with the command:

* its guard (:mod:`.guard`), on stdout: the CPU seconds of the command, its stopped state,
  the signal that ended it and its exit code (``mxlbbsp guard: ...``); such a line may
  follow a partial line of the command's, which had no newline yet, on the same line;
* the workers' exit hook (``_boot/sitecustomize.py``), on stderr: why the script ended
  (``mxlbbsp-exit-hook: CODE REASON``), or that it ended normally
  (``mxlbbsp-exit-hook: ended``), or that its host was given notice in an elastic job
  (``mxlbbsp-exit-hook: preempted``, as its guard says ``mxlbbsp guard: preempted``);
* the library and the guard refusing bad input, on stderr: ``mxlbbsp: error: ...``, held
  back because the launcher's failure line carries it, once.

:class:`Said` keeps what they said and tells :class:`~.procs.RoleProcess` what is left to
show. No I/O here.
"""
from __future__ import annotations

import time
from typing import Optional, Pattern, Tuple

from .guard import CONTINUED, CPU, EXITED, PREEMPTED, SIGNALLED, STOPPED

#: the line a worker's exit hook writes before it ends (``_boot/sitecustomize.py``, MARKER):
#: ``<EXIT_MARKER> <code> <the exception's last line>``
EXIT_MARKER = "mxlbbsp-exit-hook:"
#: the line a worker's exit hook writes when its script ended normally (``ENDED`` there)
ENDED_MARKER = EXIT_MARKER + " ended"
#: the line a worker's exit hook writes on a preemption notice (``PREEMPTED`` there)
PREEMPTED_MARKER = EXIT_MARKER + " preempted"
#: how the library (mxlbbsp.core.env.refuse, mxlbbsp.worker.checkpoint) and the guard refuse bad input
ERROR_PREFIX = "mxlbbsp: error: "


def _seconds(text: str) -> Optional[float]:
    """The CPU seconds of a guard CPU line's tail, None if it is not one."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 else None


def _exit_code(text: str) -> Optional[int]:
    """The exit code of a guard exit line's tail, None if it is not one."""
    text = text.strip()
    return int(text) if text.isdigit() else None


def _state(text: str) -> Optional[bool]:
    """True when a guard state line's tail is empty (it is one), else None."""
    return True if not text.strip() else None


def _guard_tail(text: str, marker: str, parse) -> tuple:
    """(what comes before, the parsed value) when ``text`` ends with a guard line ``marker
    VALUE``: a line of its own (then what comes before is ""), or one written after a partial
    line of the command's, which had no newline yet, sharing its line; else (text, None)."""
    at = text.rfind(marker)
    value = parse(text[at + len(marker):]) if at >= 0 else None
    return (text, None) if value is None else (text[:at], value)


class Said:
    """What a role's guard, exit hook and refusals said (see the module docstring)."""

    def __init__(self):
        #: the guard's last CPU report: (time.monotonic() when it came, CPU seconds)
        self.cpu_report: Optional[Tuple[float, float]] = None
        #: the command's exit code as the guard reported it (None: the guard did not say)
        self.reported_exit: Optional[int] = None
        #: the signal that ended the command, as the guard reported it (None: none)
        self.signalled: Optional[int] = None
        #: the command is stopped (SIGSTOP, a debugger), as its (remote) guard said
        self.stopped = False
        #: why the command ended, as its exit hook said (e.g. "RuntimeError: boom")
        self.exit_reason: Optional[str] = None
        #: time.monotonic() when its exit hook said that the script ended normally (the
        #: process may still wait in ps-lite's finalize barrier); None: not (yet)
        self.ended_at: Optional[float] = None
        #: the command's own one-line refusal ("mxlbbsp: error: ..." from the library or
        #: the guard), held back: the launcher's failure line carries it, once
        self.error_line: Optional[str] = None
        #: its last line on stderr that was shown (over SSH: ssh's own word on a lost
        #: connection, if any)
        self.last_stderr: Optional[str] = None
        #: time.monotonic() when the role's host was given notice (SIGTERM to its guard or
        #: its worker, in an elastic job); None: not
        self.preempted_at: Optional[float] = None

    def refusal(self, text: str, to_stderr: bool) -> bool:
        """Whether the line is a refusal (kept, not shown). Asked first: the guard's refusal
        on stderr may be read before its start line on stdout, and is no transport message
        to hold back."""
        if to_stderr and text.startswith(ERROR_PREFIX):
            self.error_line = text[len(ERROR_PREFIX):]
            return True
        return False

    def take(self, text: str, to_stderr: bool,
             hide: Optional[Pattern] = None) -> Tuple[Optional[str], bool]:
        """(what of the line to show, None for nothing; whether the raw line goes to the
        role's log anyway). ``hide``: the transport's own stderr lines not to show."""
        if not to_stderr:
            text, seconds = _guard_tail(text, CPU, _seconds)
            if seconds is not None:
                self.cpu_report = (time.monotonic(), seconds)
            text, code = _guard_tail(text, EXITED, _exit_code)
            if code is not None:
                self.reported_exit = code
            text, signum = _guard_tail(text, SIGNALLED, _exit_code)
            if signum is not None:
                self.signalled = signum
            text, notice = _guard_tail(text, PREEMPTED, _state)
            if notice is not None and self.preempted_at is None:
                self.preempted_at = time.monotonic()
            text, stop = _guard_tail(text, STOPPED, _state)
            text, cont = _guard_tail(text, CONTINUED, _state)
            if stop is not None or cont is not None:
                self.stopped = stop is not None
            said = (seconds, code, signum, notice, stop, cont)
            if not text and any(v is not None for v in said):
                return None, False
            return text, True
        if text == ENDED_MARKER:
            self.ended_at = time.monotonic()
            return None, True
        if text == PREEMPTED_MARKER:
            if self.preempted_at is None:
                self.preempted_at = time.monotonic()
            return None, True
        if text.startswith(EXIT_MARKER):
            self.exit_reason = text[len(EXIT_MARKER):].strip().partition(" ")[2]
            return None, True
        if hide is not None and hide.search(text):
            return None, True
        self.last_stderr = text
        return text, True
