"""The core layer: what every other layer of mxlbbsp shares, and nothing above it.

The environment contract between the launcher and the roles (env), the wire protocol and
the frames, the control plane's connections (peer) and its rank router (links), the time
models and the split, the metrics schema and its totals, the checkpoint store, Courier's
planner, the learning-rate rules, host signals and emulated slowdowns.

Rule (checked by import-linter in CI, see pyproject.toml): modules here import only the
standard library, numpy, psutil and each other; never MXNet, never another mxlbbsp layer.
"""
