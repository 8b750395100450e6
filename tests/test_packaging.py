"""The installed package is the source tree: every subpackage and data file is declared."""
import subprocess
import sys
import tomllib

import pytest

from conftest import ROOT


def test_every_subpackage_is_declared_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(config["packages"])
    dirs = {"mxlbbsp": ROOT / "mxlbbsp", **{k: ROOT / v for k, v in
                                            config["package-dir"].items()}}
    found = set()
    for name, folder in dirs.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            found.add(".".join((name, *rel)))
    assert found <= declared, f"missing in pyproject.toml packages: {sorted(found - declared)}"
    # the workers' exit hook is a plain folder on PYTHONPATH, shipped as package data
    assert "_boot/sitecustomize.py" in config["package-data"]["mxlbbsp.launcher"]
    assert (ROOT / "launcher" / "_boot" / "sitecustomize.py").is_file()


def test_mxnet_is_an_extra_so_that_cuda_builds_can_stand_in():
    """`mxnet` (the CPU wheel) and `mxnet-cu112` etc. are distributions of the one module: a
    hard dependency on the CPU wheel would install it over a user's CUDA build."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("mxnet")]
    assert project["optional-dependencies"]["cpu"] == ["mxnet==1.9.1"]
    # make venv and CI still install the CPU wheel
    assert "mxnet==1.9.1" in (ROOT / "requirements.txt").read_text().splitlines()


@pytest.mark.parametrize("code", [
    "import mxlbbsp; mxlbbsp.DataLoader",
    "import mxlbbsp; mxlbbsp.Trainer",
    "import os, sys; os.environ['DMLC_ROLE'] = 'server'; from mxlbbsp import server; "
    "sys.exit(server.main())",
])
def test_without_mxnet_the_worker_side_says_what_to_install(code):
    # sys.modules["mxnet"] = None: `import mxnet` fails as if nothing were installed
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.modules['mxnet'] = None; "
                           + code], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "mxlbbsp needs MXNet in this Python" in last, proc.stderr
    assert "pip install mxnet==1.9.1" in last and "mxnet-cu112" in last
    if "server" in code:
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
