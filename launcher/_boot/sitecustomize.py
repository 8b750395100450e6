"""mxlbbsp's exit hook for the workers of a job: a failing worker ends instead of hanging.

Why: MXNet's distributed kvstore finalises ps-lite with a barrier of every worker when the
``KVStore`` object is freed (``KVStore.__del__`` -> ``MXKVStoreFree`` -> ``~KVStoreDist`` ->
``ps::Finalize(barrier)``), which happens during interpreter teardown. A worker whose
script ended with an uncaught exception still tears down, and waits there for the other
workers, which wait for it in their next push/pull: the job hangs forever.

How: ``mxlbbsp launch`` puts this folder first on every worker's ``PYTHONPATH`` (the guard
does, on the host the worker runs on), so Python imports this module at start-up, before the
user's script. It

* chains to any ``sitecustomize`` found further down the path (it still runs, as before);
* wraps ``sys.excepthook``: an uncaught exception in the main thread prints its traceback as
  usual (through the hook that was there), then a marker line for the launcher, flushes
  stdout and stderr and ends the process at once with ``os._exit(1)``: no interpreter
  teardown, so no finalize barrier;
* for a script that replaces ``sys.excepthook`` with its own: an ``atexit`` handler,
  registered before the script runs and so run after every handler the script registers,
  ends the process with ``os._exit(1)`` when the interpreter is going down because of an
  uncaught exception (Python sets ``sys.last_value`` when it prints one at the top level, and
  the outermost frame of its traceback is the main module's, or runpy's for ``-m``): the
  script's hook and atexit handlers have run, the finalize barrier does not;
* makes a non-zero ``SystemExit`` that reaches the top level end the process with its code
  the same way. ``sys.excepthook`` never sees ``SystemExit``; instead ``builtins.SystemExit``
  becomes a subclass (printed and caught as ``SystemExit``) whose ``__del__`` runs when the
  interpreter frees the exception: in the main thread with no Python frame on the stack, it
  reached the top level (a caught one is freed inside the frame that caught it). ``sys.exit``
  is wrapped to raise it.

In an elastic job (``MXLBBSP_PREEMPTIBLE=1``, set by the guard) SIGTERM is a preemption
notice: the worker says ``mxlbbsp-exit-hook: preempted`` on stderr and trains on; the launcher
resizes the job around its host at an iteration boundary, and the guard then ends it with
SIGUSR2.

What stays as before: scripts that catch their exceptions, ``sys.exit(0)``, ``sys.exit()``,
a normal end (the normal finalize, barrier included), exceptions in other threads.

A normal end is announced: the same ``atexit`` handler, when the interpreter goes down
without an uncaught exception, writes ``mxlbbsp-exit-hook: ended`` on stderr before the
finalize barrier. A worker that ends its script while the others still wait for its next
push/pull (workers that run different numbers of iterations) then waits in that barrier
forever, and nothing of it fails: the launcher hides the line, and ends the job when the
other workers show no progress for a while after it (``launcher/watch.py``). Only the
worker's own process announces (the first process that imported this module, whose pid it
leaves in ``MXLBBSP_EXIT_HOOK_PID`` for its children), not the Python processes it starts.
Not covered (the launcher's stall detection is the backstop): a ``SystemExit`` kept alive in
a reference cycle (freed only by a later garbage collection); a ``SystemExit`` raised by C
code other than ``sys.exit`` (e.g. ``_thread.exit``), and ``except SystemExit`` clauses do not
catch such a plain one; a hang in native code; a Python started with ``-S``, ``-I`` or
``-E`` (no sitecustomize, or no ``PYTHONPATH``). ``MXLBBSP_EXIT_HOOK=0`` in the environment
(``--env``) turns the hook off.

Only the standard library (and little of it): this runs in every Python process a worker
starts.
"""
import builtins
import os
import sys

#: the variable that turns the hook off (``0``); named in :mod:`mxlbbsp.core.env`
ENABLE = "MXLBBSP_EXIT_HOOK"
#: the marker line on stderr: ``<MARKER> <exit code> <the exception's last line>``
MARKER = "mxlbbsp-exit-hook:"
#: the line on stderr when the worker's script ended normally (before the finalize barrier)
ENDED = MARKER + " ended"
#: the pid of the worker's own process (the first that imported this module); its children
#: inherit it and do not announce their end
TOP_PID = "MXLBBSP_EXIT_HOOK_PID"
#: set by the guard of a role in an elastic job (launcher/guard.py): SIGTERM is then a
#: preemption notice (the job shrinks around this host at an iteration boundary), and the
#: guard ends the role with SIGUSR2 instead
PREEMPTIBLE = "MXLBBSP_PREEMPTIBLE"
#: the line on stderr when the worker got its preemption notice (once)
PREEMPTED = MARKER + " preempted"

_HERE = os.path.dirname(os.path.abspath(__file__))
_PlainSystemExit = SystemExit


def _chain() -> None:
    """Import the ``sitecustomize`` this one hides (the next one on ``sys.path``)."""
    import importlib
    me = sys.modules.get(__name__)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    try:
        del sys.modules[__name__]
        try:
            importlib.import_module("sitecustomize")
        except ImportError as exc:
            if exc.name != "sitecustomize":
                raise
    finally:
        sys.path[:] = saved
        other = sys.modules.get("sitecustomize")
        sys.modules["mxlbbsp_exit_hook"] = me
        if other is None:
            sys.modules["sitecustomize"] = me


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


def _end(code: int, what: str) -> None:
    """Tell the launcher why (one line on stderr), flush, and end now."""
    what = " ".join(what.split())[:500]
    _flush()
    try:
        os.write(2, f"{MARKER} {code} {what}\n".encode("utf-8", "replace"))
    except OSError:
        pass
    os._exit(code)


def _main_thread() -> bool:
    import threading  # imported by now if anything started a thread
    return threading.current_thread() is threading.main_thread()


def _excepthook(previous):
    def hook(exc_type, exc, tb):
        try:
            previous(exc_type, exc, tb)
        except BaseException:           # noqa: BLE001 - whatever the script's hook raises,
            sys.__excepthook__(exc_type, exc, tb)   # the worker must still end
        if exc_type is None or not _main_thread():
            return
        if issubclass(exc_type, KeyboardInterrupt):
            _end(130, "KeyboardInterrupt")  # Python's own status for it is 128 + SIGINT
        _end(1, _reason(exc_type, exc))
    hook.mxlbbsp_exit_hook = True
    return hook


def _reason(exc_type, exc) -> str:
    """The exception in one line, as the launcher shows why a worker ended."""
    import traceback  # (a broken __str__ is handled there)
    lines = [ln for ln in "".join(traceback.format_exception_only(exc_type, exc)).splitlines()
             if ln.strip()]
    if issubclass(exc_type, SyntaxError):
        lines = lines[-1:]             # the message (after the file, the code, the caret)
    return " ".join(lines) or exc_type.__name__


class SystemExit(_PlainSystemExit):    # noqa: A001 - replaces the builtin on purpose
    """``SystemExit``, plus: a non-zero one that reaches the top level ends the process."""

    def __del__(self):
        try:
            sys._getframe(1)
            return                     # freed inside a frame: it was caught
        except ValueError:
            pass
        code = self.code
        if code is None or code == 0 or not _main_thread():
            return
        if isinstance(code, int):
            if code & 0xFF:            # the status the OS would give (256 is a success)
                _end(code & 0xFF, f"SystemExit: {code}")
            return
        try:
            sys.stderr.write(f"{code}\n")   # as Python prints a non-integer exit code
        except (OSError, ValueError, AttributeError):
            pass
        _end(1, f"SystemExit: {code}")


SystemExit.__module__ = "builtins"
SystemExit.__qualname__ = "SystemExit"


def _exit(status=None):
    """``sys.exit``: raises mxlbbsp's ``SystemExit`` (see the module docstring)."""
    raise SystemExit(status)


def _uncaught_at_exit() -> None:
    """atexit: the script ended normally (announced), or it replaced ``sys.excepthook`` and
    died of an uncaught exception (ended now)."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is None:
        _announce_end()
        return
    if getattr(sys.excepthook, "mxlbbsp_exit_hook", False):
        return                         # our hook saw the uncaught exception already
    tb = getattr(exc, "__traceback__", None)
    if tb is None or not _main_thread():
        return
    top = tb.tb_frame
    where = top.f_globals.get("__name__")
    if not (where == "__main__" and top.f_code.co_name == "<module>") and where != "runpy":
        return                         # set by other code (e.g. the code module): not ours
    _end(1, _reason(type(exc), exc))


def _announce_end() -> None:
    """The script ended normally: say so (the worker's own process only, see above)."""
    if os.environ.get(TOP_PID) != str(os.getpid()) or not _main_thread():
        return
    _flush()
    try:
        os.write(2, f"{ENDED}\n".encode())
    except OSError:
        pass


_noticed = []


def _on_preemption(signum, frame) -> None:
    """SIGTERM in an elastic job: say so once (the worker's own process; the processes it
    started inherit the handler and stay quiet), and go on training until the launcher
    has resized the job around this host."""
    if _noticed or os.environ.get(TOP_PID) != str(os.getpid()):
        return
    _noticed.append(True)
    try:
        os.write(2, f"{PREEMPTED}\n".encode())
    except OSError:
        pass


def _thread_excepthook_ignoring_ours(previous):
    def hook(args):
        if args.exc_type is SystemExit:
            return                     # as for a plain SystemExit: silently ignored
        previous(args)
    return hook


def install() -> None:
    if os.environ.get(ENABLE, "1") == "0":
        return
    os.environ.setdefault(TOP_PID, str(os.getpid()))
    sys.excepthook = _excepthook(sys.excepthook)
    import atexit
    atexit.register(_uncaught_at_exit)
    builtins.SystemExit = SystemExit
    _exit.__doc__ = sys.exit.__doc__
    sys.exit = _exit
    import threading  # cheap, and any MXNet script imports it anyway
    threading.excepthook = _thread_excepthook_ignoring_ours(threading.excepthook)
    if os.environ.get(PREEMPTIBLE) == "1":
        import signal
        signal.signal(signal.SIGTERM, _on_preemption)


install()
_chain()
