"""Debian packages for the test fixtures (tests/sshd.py, tests/slurm.py), installed on demand."""
import os
import shutil
import subprocess
from typing import Optional, Sequence


def install(packages: Sequence[str], missing: str) -> Optional[str]:
    """``apt-get update`` and ``install`` of ``packages``: None when it worked, else why not.
    ``missing`` says what is missing, for the reasons that nothing could be tried."""
    if shutil.which("apt-get") is None:
        return f"{missing} missing and there is no apt-get to install {' '.join(packages)}"
    if os.geteuid() != 0:
        return f"{missing} missing and only root can install {' '.join(packages)}"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-q"],
                 ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
        try:
            res = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                 text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`{' '.join(argv)}` failed: {exc}"
        if res.returncode != 0:
            tail = (res.stderr.strip().splitlines() or ["?"])[-1]
            return f"`{' '.join(argv)}` exited {res.returncode}: {tail}"
    return None
