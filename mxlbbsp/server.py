"""``python -m mxlbbsp.server``: an MXNet parameter server or ps-lite scheduler.

The launcher starts servers (DMLC_ROLE=server) and the scheduler (DMLC_ROLE=scheduler) this
way rather than with ``python -c "import mxnet"`` so that mxlbbsp is importable in the
server process: the optimizer that the workers send with ``kv.set_optimizer`` is unpickled
there, and an optimizer class from an installed module (not ``__main__``) can be. Importing
mxnet with the role set runs the server loop until the job ends, then exits.
"""
import signal
import sys

from mxlbbsp.core import env as _env
from mxlbbsp.core.env import NO_MXNET


def main() -> int:
    role = _env.role()
    if role not in ("server", "scheduler"):
        sys.stderr.write("mxlbbsp.server: error: DMLC_ROLE must be 'server' or 'scheduler' "
                         f"(got {role!r}); `mxlbbsp launch` starts these processes for you\n")
        return 2
    if _env.preemptible():
        # an elastic job's host given notice: serve on until the job is resized around it
        # (the guard ends this process with SIGUSR2); the handler never runs while the
        # server loop holds the main thread, but the process no longer dies of SIGTERM
        signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        import mxnet  # noqa: F401  (serves until the workers finish, then calls sys.exit)
    except ModuleNotFoundError as exc:
        if exc.name != "mxnet":
            raise
        sys.stderr.write(f"mxlbbsp: error: {NO_MXNET}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
