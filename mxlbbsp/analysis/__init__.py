"""The analysis layer: what reads a finished job's metrics.

``mxlbbsp report`` (report), ``mxlbbsp trace`` (trace) and the profile fit behind
``mxlbbsp plan`` (profile).

Rule (import-linter): imports core, modes and predictors; never control/, worker/ or MXNet.
"""
