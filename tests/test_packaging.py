"""The installed package is the source tree: every subpackage and data file is declared."""
import tomllib

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
