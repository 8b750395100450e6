"""Wire protocol between workers and the coordinator: one JSON object per line over TCP.

A connection starts with the worker's ``hello``, which carries the job's secret token; the
coordinator closes any connection whose first line is not a ``hello`` with the right token.

worker -> coordinator
    hello   {rank, token, pid, host, global_batch_size, dataset_size, max_batch_size}
    report  {iteration, batch_size, compute_s, cpu_percent, mem_percent, slowdown,
             next_global_batch[, after_next_global_batch, others_cpu, ctx_invol, run_delay,
             cpu_pressure, steal, runq, others_cpu_tail, run_delay_tail,
             cpu_pressure_tail]}      sent when iteration t's gradients are ready;
                                      next_global_batch is B(t+1) (a mode that sets B: the
                                      most it may be, the rest of the epoch), and
                                      after_next_global_batch B(t+2) when the loader knows
                                      it (the split the coordinator decides from this
                                      report); the optional contention signals:
                                      mxlbbsp.core.signals; the first also carries the
                                      trainer's momentum (when its optimizer has one) and
                                      batchnorm (true/false)
    done    {iteration, wait_s, sync_s, iteration_s}   sent after t's push/pull
    log     {iteration, scalars}      the script's own values of ``iteration`` (mxlbbsp.log):
                                      {name: number or null}, at most 32 names
    bye     {iteration}               the worker's training ended after ``iteration`` (its
                                      last; -1: none, absent: an older worker)
    request {iteration, next_global_batch}   (r2sp) request to proceed: the worker's gradients
                                      of ``iteration`` are ready, it waits for a push slot
coordinator -> worker
    welcome {num_workers, sync, split[, period_s]}   every worker has said hello; ``split``
                                      is the first iteration's (a mode whose splits are
                                      decided ahead, lbbsp, sends the next slices right
                                      after it); ``period_s``: how long a worker may hold
                                      its reports, dones and logs to send them in one write
                                      (absent: send each at once)
    slice   {iteration, offset, size, total[, until]}   this worker's slice of the global
                                      batch at ``iteration``: samples [offset, offset + size)
                                      of total; with ``until``, the same slice at every
                                      iteration from ``iteration`` to ``until`` (a lease:
                                      the coordinator decides once per control period).
                                      One message per worker, so a broadcast to n workers is
                                      O(n) bytes, not O(n^2)
    grant   {iteration, offset, size, total}   (r2sp) permission to push ``iteration`` now;
                                      carries the worker's slice of iteration + 1 (null
                                      fields when there is none)
    error   {message}                 fatal; the worker stops with this message

A host's relay (:mod:`mxlbbsp.relay`) speaks this protocol with its workers, and says hello
to the coordinator as ``relay {token, host, workers, pid}``; its connection then carries the
binary frames of :mod:`mxlbbsp.core.frames`.

Addresses (``MXLBBSP_COORDINATOR``): ``host:port`` (TCP), or ``unix:PATH`` for a Unix socket
on the same host (a relay's), or ``unix:@NAME`` in Linux's abstract namespace.

No framework imports; stdlib only.
"""
from __future__ import annotations

import hmac
import json
import socket
from typing import Any, Dict, Optional, Sequence, Tuple, Union

MAX_LINE = 1 << 20  # bytes; longer lines are a protocol error
#: before a connection has authenticated (its first line, the hello), nothing longer is read
MAX_HELLO = 4096
#: no message of this protocol holds more than a couple of arrays/objects; a line with more
#: brackets than this is refused before json.loads (whose recursion a deep one would exhaust)
MAX_CONTAINERS = 64

HELLO, REPORT, DONE, BYE, LOG = "hello", "report", "done", "bye", "log"
WELCOME, SLICE, ERROR = "welcome", "slice", "error"
REQUEST, GRANT = "request", "grant"
RELAY = "relay"
#: an elastic job's hand-over (launcher/elastic.py): the coordinator asks one worker for
#: the job's state (``mode``: "boundary", at the end of its current step, then it halts;
#: "snapshot", the last finished iteration's, at once); the worker answers ``saved``
#: (``iteration`` and ``path``, or ``error``)
CHECKPOINT, SAVED = "checkpoint", "saved"
#: a worker started ahead of its job (launcher/hold.py): it says ``hold`` (its token and
#: rank) and waits for ``release`` (``resume``: the checkpoint to resume from, or null)
HOLD, RELEASE = "hold", "release"

#: a TCP address (host, port), or a Unix socket's path ("\0NAME": the abstract namespace)
Address = Union[Tuple[str, int], str]


class ProtocolError(ValueError):
    """A malformed or unexpected message."""


def encode(msg: Dict[str, Any]) -> bytes:
    return (json.dumps(msg, separators=(",", ":"), allow_nan=False) + "\n").encode()


def decode(line: bytes, max_len: int = MAX_LINE) -> Dict[str, Any]:
    if len(line) > max_len:
        raise ProtocolError(f"message longer than {max_len} bytes")
    if line.count(b"[") + line.count(b"{") > MAX_CONTAINERS:
        raise ProtocolError(f"message with more than {MAX_CONTAINERS} nested or listed "
                            "arrays/objects")
    try:
        msg = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("message nested too deeply") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError("a message is a JSON object with a string 'type'")
    return msg


def token_ok(msg: Dict[str, Any], token: str) -> bool:
    """Constant-time check of a hello's token."""
    got = msg.get("token")
    return isinstance(got, str) and hmac.compare_digest(got.encode(), token.encode())


def _finite(x: Optional[float]) -> Optional[float]:
    return None if x is None or x != x or x in (float("inf"), float("-inf")) else float(x)


def parse_address(text: str) -> Address:
    """``host:port`` as (host, port), ``unix:PATH`` as PATH (``unix:@NAME`` as "\0NAME");
    ValueError (one line) for anything else."""
    if text.startswith("unix:"):
        path = text[5:]
        if not path:
            raise ValueError(f"{text!r}: expected unix:PATH or unix:@NAME")
        return "\0" + path[1:] if path.startswith("@") else path
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{text!r}: expected host:port, unix:PATH or unix:@NAME")
    return host.strip("[]"), int(port)


def format_address(address: Address) -> str:
    """The text :func:`parse_address` reads back as ``address``."""
    if isinstance(address, str):
        return "unix:" + ("@" + address[1:] if address.startswith("\0") else address)
    host, port = address[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def connect(address: Address, timeout: Optional[float] = None) -> socket.socket:
    """A connected socket to ``address`` (OSError when it cannot be reached)."""
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError:
            sock.close()
            raise
        return sock
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def hello(rank: int, token: str, pid: int, host: str, global_batch_size: int,
          dataset_size: int, max_batch_size: Optional[int]) -> Dict[str, Any]:
    return {"type": HELLO, "rank": rank, "token": token, "pid": pid, "host": host,
            "global_batch_size": global_batch_size, "dataset_size": dataset_size,
            "max_batch_size": max_batch_size}


def report(iteration: int, batch_size: int, compute_s: float, cpu_percent: float,
           mem_percent: float, slowdown: float, next_global_batch: Optional[int],
           signals: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
    msg = {"type": REPORT, "iteration": iteration, "batch_size": batch_size,
           "compute_s": _finite(compute_s), "cpu_percent": _finite(cpu_percent),
           "mem_percent": _finite(mem_percent), "slowdown": slowdown,
           "next_global_batch": next_global_batch}
    for name, value in (signals or {}).items():    # optional fields; NaN travels as null
        msg[name] = _finite(value)
    return msg


def done(iteration: int, wait_s: float, sync_s: float, iteration_s: float) -> Dict[str, Any]:
    return {"type": DONE, "iteration": iteration, "wait_s": _finite(wait_s),
            "sync_s": _finite(sync_s), "iteration_s": _finite(iteration_s)}


def log(iteration: int, scalars: Dict[str, float]) -> Dict[str, Any]:
    """The script's values of ``iteration`` (:func:`mxlbbsp.log`); NaN travels as null."""
    return {"type": LOG, "iteration": int(iteration),
            "scalars": {str(k): _finite(v) for k, v in scalars.items()}}


def scalars_of(msg: Dict[str, Any], max_names: int = 32, max_name: int = 64) -> Dict[str, Any]:
    """The checked ``scalars`` of a ``log`` message (ProtocolError when malformed)."""
    values = msg.get("scalars")
    if not isinstance(values, dict) or len(values) > max_names:
        raise ProtocolError(f"a log message holds an object of at most {max_names} scalars")
    for name, value in values.items():
        if not 0 < len(name) <= max_name or not (
                value is None or (isinstance(value, (int, float))
                                  and not isinstance(value, bool))):
            raise ProtocolError(f"log message: scalar {name[:80]!r} is not a number")
    return values


def bye(iteration: Optional[int] = None) -> Dict[str, Any]:
    """``iteration``: the worker's last reported iteration (-1: none); None leaves it out
    (the coordinator then cannot tell an early end)."""
    msg: Dict[str, Any] = {"type": BYE}
    if iteration is not None:
        msg["iteration"] = int(iteration)
    return msg


def relay_hello(token: str, host: str, workers: int, pid: int) -> Dict[str, Any]:
    """A relay's first line to the coordinator (:mod:`mxlbbsp.core.frames` follow)."""
    return {"type": RELAY, "token": token, "host": host, "workers": workers, "pid": pid}


def relay_of(msg: Dict[str, Any]) -> Tuple[str, int]:
    """A relay's hello's host and number of workers (ProtocolError without them)."""
    host, workers = msg.get("host"), msg.get("workers")
    if not isinstance(host, str) or type(workers) is not int or workers < 1:
        raise ProtocolError("a relay's hello needs its host and its number of workers")
    return host, workers


def welcome(num_workers: int, sync: str, split: Sequence[int],
            period_s: float = 0.0) -> Dict[str, Any]:
    msg = {"type": WELCOME, "num_workers": num_workers, "sync": sync,
           "split": [int(b) for b in split]}
    if period_s > 0:
        msg["period_s"] = float(period_s)
    return msg


def slice_message(iteration: int, offset: int, size: int, total: int,
                  until: Optional[int] = None) -> Dict[str, Any]:
    msg = {"type": SLICE, "iteration": iteration, "offset": offset, "size": size,
           "total": total}
    if until is not None and until != iteration:
        msg["until"] = until
    return msg


def slice_line(iteration: int, offset: int, size: int, total: int,
               until: Optional[int] = None) -> bytes:
    """``encode(slice_message(...))``, without json: the coordinator writes n of these at
    once."""
    if until is not None and until != iteration:
        return (b'{"type":"slice","iteration":%d,"offset":%d,"size":%d,"total":%d,'
                b'"until":%d}\n' % (iteration, offset, size, total, until))
    return b'{"type":"slice","iteration":%d,"offset":%d,"size":%d,"total":%d}\n' % (
        iteration, offset, size, total)


def request(iteration: int, next_global_batch: Optional[int]) -> Dict[str, Any]:
    return {"type": REQUEST, "iteration": iteration, "next_global_batch": next_global_batch}


def grant(iteration: int, part: Optional[Sequence[int]]) -> Dict[str, Any]:
    """``part``: (offset, size, total) of the worker's slice of ``iteration + 1``, or None."""
    offset, size, total = (None, None, None) if part is None else (int(x) for x in part)
    return {"type": GRANT, "iteration": iteration, "offset": offset, "size": size,
            "total": total}


def hold(rank: int, token: str) -> Dict[str, Any]:
    return {"type": HOLD, "rank": rank, "token": token}


def release(resume: Optional[str]) -> Dict[str, Any]:
    return {"type": RELEASE, "resume": resume}


def error(message: str) -> Dict[str, Any]:
    return {"type": ERROR, "message": message}
