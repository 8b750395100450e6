"""The relay layer: one process per host with two or more workers (``python -m mxlbbsp.relay``).

Its workers talk to it as to the coordinator; it talks to the coordinator in one connection,
a host's reports and dones of an iteration in one binary frame each (:mod:`.relay`).

Rule (import-linter): imports core only (stdlib and numpy): no MXNet, no modes, predictors or
control.
"""
