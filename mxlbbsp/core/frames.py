"""Binary frames between a host's relay (:mod:`mxlbbsp.relay`) and the coordinator, and the
columnar batch of reports or dones that both sides hand around (:class:`Rows`).

A relay opens one TCP connection to the coordinator and says hello in one JSON line
(:func:`mxlbbsp.core.protocol.relay_hello`, with the job's token); from then on both
directions carry frames::

    frame = kind (u8), 3 bytes of padding, length of the body (u32, little-endian), body

relay -> coordinator
    ROWS     a section: reports, or dones, of one iteration from some of the host's workers,
             one column per field (see below): what the coordinator reads as arrays
    FORWARD  <i4 rank> + one JSON message of that worker as it sent it (hello, log, bye, a
             mode's own such as r2sp's request): the coordinator reads it as from the worker
    LOST     <i4 rank>: that worker's connection to the relay closed
coordinator -> relay
    CONFIG   a JSON object: ``hold_s``, how long the relay may hold a section back waiting
             for the rest of its workers (0: flush once the messages at hand are read)
    TO_RANK  <i4 rank> + one JSON line, for that worker
    TO_ALL   one JSON line, for every worker of the relay
    SLICES   <q iteration, q total, q count> + count int64 ranks, offsets and sizes: the
             ``alloc`` line of each of these workers (the split, one frame per host)
    CLOSE    <i4 rank>: close that worker's connection (after an error sent to it)

A ROWS body: a 24-byte head (what: 0 report, 1 done; column count; row count; the
iteration; the length of the names), the column names with their kind (``kind + name``,
NUL-separated, padded to 8 bytes), one int64 block of 2 + numeric columns rows (the ranks,
the seconds each message waited in the relay as float64 bits, then each numeric column), and
each ``j`` column as int64 lengths plus UTF-8 JSON texts. A column's kind is the JSON type of
its value in every row of the section: ``i`` an integer (int64), ``f`` a float, ``b`` a bool,
``n`` null (no data), ``j`` anything else (the JSON text). Messages whose fields differ in
name or kind go into separate sections, so a message read back is the message sent, field
for field (the fields in their order, after ``type`` and ``iteration``); a float NaN, which
the workers never send (NaN travels as null), reads back as a float NaN.

No framework import; stdlib and numpy.
"""
from __future__ import annotations

import json
import struct
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mxlbbsp.core import protocol as P

HEADER = struct.Struct("<B3xI")
_ROWS_HEAD = struct.Struct("<BxHIqI4x")
_RANK = struct.Struct("<i")
_SLICES_HEAD = struct.Struct("<qqq")
#: the longest frame read (a section of ~10 000 workers' reports)
MAX_FRAME = 1 << 24

ROWS, FORWARD, LOST = 1, 2, 3
CONFIG, TO_RANK, TO_ALL, SLICES, CLOSE = 11, 12, 13, 14, 15
#: the message types a relay sends as ROWS (what: their index)
BATCHED = (P.REPORT, P.DONE)
_INT64 = (-(1 << 63), (1 << 63) - 1)


class FrameError(P.ProtocolError):
    """A malformed frame."""


def frame(kind: int, body: bytes) -> bytes:
    return HEADER.pack(kind, len(body)) + body


def split_frames(buffer: bytearray, limit: int = MAX_FRAME) -> Tuple[List[Tuple[int, bytes]], int]:
    """The complete frames at the start of ``buffer`` as (kind, body) and how many bytes
    they take (the caller deletes them); FrameError for a frame longer than ``limit``."""
    out, start, size = [], 0, len(buffer)
    with memoryview(buffer) as view:
        while size - start >= 8:
            kind, length = HEADER.unpack_from(view, start)
            if length > limit:
                raise FrameError(f"frame of {length} bytes (at most {limit})")
            end = start + 8 + length
            if end > size:
                break
            out.append((kind, view[start + 8:end].tobytes()))
            start = end
    return out, start


def rank_frame(kind: int, rank: int, payload: bytes = b"") -> bytes:
    """A FORWARD, LOST, TO_RANK or CLOSE frame."""
    return frame(kind, _RANK.pack(rank) + payload)


def split_rank(body) -> Tuple[int, bytes]:
    if len(body) < 4:
        raise FrameError("a frame for a worker without its rank")
    return _RANK.unpack_from(body)[0], bytes(body[4:])


def slices_frame(iteration: int, total: int, ranks: np.ndarray, offsets: np.ndarray,
                 sizes: np.ndarray) -> bytes:
    body = b"".join((_SLICES_HEAD.pack(iteration, total, len(ranks)),
                     np.ascontiguousarray(ranks, "<i8").tobytes(),
                     np.ascontiguousarray(offsets, "<i8").tobytes(),
                     np.ascontiguousarray(sizes, "<i8").tobytes()))
    return frame(SLICES, body)


def alloc_lines(body) -> List[Tuple[int, bytes]]:
    """(rank, its ``alloc`` line) of each worker of a SLICES frame."""
    iteration, total, count = _SLICES_HEAD.unpack_from(body)
    if len(body) != 24 + 24 * count:
        raise FrameError("a SLICES frame of the wrong length")
    data = np.frombuffer(body, "<i8", 3 * count, 24).reshape(3, count).tolist()
    line = P.alloc_line
    return [(r, line(iteration, o, s, total)) for r, o, s in zip(*data)]


def _kind(value) -> str:
    t = type(value)
    if t is float:
        return "f"
    if t is int:
        return "i" if _INT64[0] <= value <= _INT64[1] else "j"
    if t is bool:
        return "b"
    return "n" if value is None else "j"


def _pad(n: int) -> int:
    return -n % 8


def encode_rows(items: Sequence[Tuple[int, dict, float]]) -> List[bytes]:
    """ROWS frames (and FORWARD frames, for messages a section cannot hold) of ``items``,
    (rank, message, seconds waited) of reports or dones of one iteration, in their order
    within each section; one section per set of field names and kinds."""
    groups: Dict[tuple, list] = {}
    out = []
    for rank, msg, waited in items:
        sig = tuple((k, _kind(v)) for k, v in msg.items() if k != "type" and k != "iteration")
        if any(not k or "\0" in k for k, _ in sig):
            out.append(rank_frame(FORWARD, rank, P.encode(msg)[:-1]))
            continue
        groups.setdefault(sig, []).append((rank, msg, waited))
    for sig, rows in groups.items():
        msg0 = rows[0][1]
        what = BATCHED.index(msg0["type"])
        names = "\0".join(kind + key for key, kind in sig).encode()
        names += b"\0" * _pad(len(names))
        numeric = [key for key, kind in sig if kind in "ifb"]
        block = np.empty((2 + len(numeric), len(rows)), dtype="<i8")
        block[0] = [r for r, _, _ in rows]
        block[1].view("<f8")[:] = [w for _, _, w in rows]
        for j, (key, kind) in enumerate((k, c) for k, c in sig if c in "ifb"):
            column = [m[key] for _, m, _ in rows]
            if kind == "f":
                block[2 + j].view("<f8")[:] = column
            else:
                block[2 + j] = column
        parts = [_ROWS_HEAD.pack(what, len(sig), len(rows), int(msg0["iteration"]),
                                 len(names)), names, block.tobytes()]
        for key, kind in sig:
            if kind == "j":
                texts = [json.dumps(m[key], separators=(",", ":"), allow_nan=False).encode()
                         for _, m, _ in rows]
                blob = b"".join(texts)
                parts += [np.array([len(x) for x in texts], dtype="<i8").tobytes(),
                          blob, b"\0" * _pad(len(blob))]
        out.append(frame(ROWS, b"".join(parts)))
    return out


#: the names of a section, parsed once per distinct names block (a relay sends the same
#: few again and again)
_NAMES: Dict[bytes, tuple] = {}


def _names(blob: bytes) -> tuple:
    got = _NAMES.get(blob)
    if got is None:
        try:
            items = blob.rstrip(b"\0").decode().split("\0") if blob.strip(b"\0") else []
        except UnicodeDecodeError:
            raise FrameError("a section's names are not UTF-8") from None
        if any(not x or x[0] not in "ifbnj" for x in items):
            raise FrameError("a section's column of no known kind")
        keys = tuple(x[1:] for x in items)
        if len(set(keys)) != len(keys) or "type" in keys or "iteration" in keys:
            raise FrameError("a section names a column twice")
        got = (keys, "".join(x[0] for x in items))
        if len(_NAMES) > 256:
            _NAMES.clear()
        _NAMES[blob] = got
    return got


def decode_rows(body, received: float) -> "Rows":
    """A ROWS frame's body as :class:`Rows`; ``received``: when it was read (time.time())."""
    try:
        what, ncols, k, t, names_len = _ROWS_HEAD.unpack_from(body)
        at = _ROWS_HEAD.size
        keys, kinds = _names(bytes(body[at:at + names_len]))
        at += names_len + _pad(names_len)
        if len(keys) != ncols or what >= len(BATCHED):
            raise FrameError("a section whose head and names disagree")
        numeric = sum(c in "ifb" for c in kinds)
        block = np.frombuffer(body, "<i8", (2 + numeric) * k, at).reshape(2 + numeric, k)
        at += block.nbytes
        texts: Dict[str, list] = {}
        for key, kind in zip(keys, kinds):
            if kind == "j":
                lengths = np.frombuffer(body, "<i8", k, at).tolist()
                at += 8 * k
                if min(lengths, default=0) < 0:
                    raise FrameError("a negative length")
                cells, pos = [], at
                for n in lengths:
                    cells.append(bytes(body[pos:pos + n]))
                    pos += n
                texts[key] = cells
                at = pos + _pad(pos - at)
        if at != len(body):
            raise FrameError("a section of the wrong length")
    except (struct.error, ValueError) as exc:
        raise FrameError(f"a malformed section ({exc})") from None
    rows = Rows(BATCHED[what], int(t), block[0], keys, kinds)
    rows.received = received - block[1].view("<f8")
    j = 2
    for key, kind in zip(keys, kinds):
        if kind in "ifb":
            rows.columns[key] = block[j].view("<f8") if kind == "f" else block[j]
            j += 1
        elif kind == "j":
            rows.columns[key] = texts[key]
    return rows


class Rows:
    """Reports, or dones, of one iteration from some workers, as columns: the batch the
    coordinator handles as arrays (one frame of a relay, or one message of a worker
    connected directly: :meth:`from_messages`).

    ``ranks`` (int64), ``received`` (float64: when each message reached the first of mxlbbsp's
    processes it went through, time.time()); ``columns``: field name -> an int64 array
    (kind ``i``, and ``b`` as 0/1), a float64 array (``f``), or a list of JSON texts
    (``j``); a field of kind ``n`` (null in every row) has no column.
    """

    __slots__ = ("what", "iteration", "ranks", "keys", "kinds", "columns", "received",
                 "_dicts")

    def __init__(self, what: str, iteration: int, ranks: np.ndarray, keys: tuple, kinds: str):
        self.what, self.iteration, self.ranks = what, iteration, ranks
        self.keys, self.kinds = keys, kinds
        self.columns: Dict[str, object] = {}
        self.received: Optional[np.ndarray] = None
        self._dicts: Optional[List[dict]] = None

    def __len__(self) -> int:
        return len(self.ranks)

    @classmethod
    def from_messages(cls, ranks: Sequence[int], messages: Sequence[dict],
                      received: float) -> "Rows":
        """Messages of one type and iteration, as they came (:meth:`dicts` returns them, a
        report with its ``time``, ``received``). Their fields are read as they are asked
        for."""
        msg0 = messages[0]
        rows = cls(msg0["type"], msg0["iteration"], np.asarray(ranks, dtype=np.int64), (), "")
        rows.received = np.full(len(messages), received)
        if rows.what == P.REPORT:
            for msg in messages:
                msg["time"] = received
        rows._dicts = list(messages)
        return rows

    def kind(self, key: str) -> Optional[str]:
        """The kind of field ``key`` (None: absent)."""
        if self._dicts is not None and not self.keys:
            kinds = {_kind(m.get(key)) if key in m else None for m in self._dicts}
            return kinds.pop() if len(kinds) == 1 else "j"
        try:
            return self.kinds[self.keys.index(key)]
        except ValueError:
            return None

    def values(self, key: str) -> list:
        """Field ``key`` of every row as Python values (None: null or absent)."""
        if self._dicts is not None and not self.keys:
            return [m.get(key) for m in self._dicts]
        kind = self.kind(key)
        column = self.columns.get(key)
        if kind is None or kind == "n":
            return [None] * len(self)
        if kind == "j":
            return [json.loads(x) for x in column]
        values = column.tolist()
        return [bool(x) for x in values] if kind == "b" else values

    def floats(self, key: str) -> np.ndarray:
        """Field ``key`` as floats (NaN: null or absent); ValueError/TypeError for a value
        that is not a number."""
        if not self.keys and self._dicts is not None:
            return np.array([_nan(m.get(key)) for m in self._dicts], dtype=float)
        kind = self.kind(key)
        if kind in ("f", "i", "b"):
            return self.columns[key].astype(float) if kind != "f" else self.columns[key]
        if kind is None or kind == "n":
            return np.full(len(self), np.nan)
        return np.array([_nan(v) for v in self.values(key)], dtype=float)

    def dicts(self) -> List[dict]:
        """Every row as the message it was (``type``, ``iteration``, then its fields; a
        report also with its ``time``, when it reached mxlbbsp)."""
        if self._dicts is None:
            keys = ("type", "iteration") + self.keys
            columns = [[self.what] * len(self), [self.iteration] * len(self)]
            columns += [self.values(key) for key in self.keys]
            if self.what == P.REPORT:
                keys += ("time",)
                columns.append(self.received.tolist())
            self._dicts = [dict(zip(keys, cells)) for cells in zip(*columns)]
        return self._dicts


def _nan(x) -> float:
    return float("nan") if x is None else float(x)


def check_iteration(msg: dict) -> int:
    """The message's iteration: an integer (ProtocolError otherwise)."""
    t = msg.get("iteration")
    if type(t) is not int:
        raise P.ProtocolError(f"a {msg.get('type')} message needs an integer iteration, "
                              f"not {t!r}")
    return t
