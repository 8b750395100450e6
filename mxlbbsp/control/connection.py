"""The coordinator's port: what it lets in and how it listens.

Its gate takes a worker's hello (the worker connected directly: JSON lines follow) or a
relay's (a host's relay or a hub: frames follow), with the job's token; everything else is
refused, with the warnings rate-limited (:class:`mxlbbsp.core.peer.Refusals`). Each
connection is a :class:`mxlbbsp.core.peer.Peer` whose owner is the coordinator's inbox
(:mod:`.inbox`).

No framework import.
"""
from __future__ import annotations

import asyncio

from mxlbbsp.core import protocol as P
from mxlbbsp.core.peer import REFUSAL_SUMMARY_S, REFUSALS_SHOWN, Gate, Peer, PeerHandler, Refusals


def hello_gate(token: str) -> Gate:
    """The coordinator's gate: a worker's or a relay's hello with ``token``; the refusals
    warned about one by one up to REFUSALS_SHOWN, then counted per REFUSAL_SUMMARY_S."""
    return Gate(token, (P.HELLO, P.RELAY), Refusals("", REFUSALS_SHOWN, REFUSAL_SUMMARY_S))


async def listen(inbox: PeerHandler, gate: Gate, host: str, port: int,
                 sock=None) -> asyncio.AbstractServer:
    """The coordinator's server on (host, port), or on ``sock`` (a socket already listening,
    whose connections may have waited in its backlog): every connection a Peer behind
    ``gate``, handed to ``inbox``."""
    if sock is not None:
        host = port = None
    return await asyncio.get_running_loop().create_server(lambda: Peer(inbox, gate), host, port,
                                                          sock=sock, backlog=4096)
