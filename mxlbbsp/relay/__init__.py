"""The relay layer: one process per host with two or more workers (``python -m mxlbbsp.relay``),
and in large jobs hubs, relays of relays (``python -m mxlbbsp.relay.hub``).

Its workers talk to a relay as to the coordinator; it talks to the coordinator (or its hub)
in one connection, a host's reports and dones of an iteration in one binary frame each
(:mod:`.relay`); a hub merges its relays' frames of an iteration into one each (:mod:`.hub`).
Both hold what goes up in a :mod:`.stream` and send it through an :mod:`.uplink`; their
connections and routing are the coordinator's (:mod:`mxlbbsp.core.peer`,
:mod:`mxlbbsp.core.links`).

Rule (import-linter): imports core and predictors only (stdlib and numpy): no MXNet, no
modes or control.
"""
