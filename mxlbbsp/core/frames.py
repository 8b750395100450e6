"""Binary frames between a host's relay (:mod:`mxlbbsp.relay`) and the coordinator, and the
columnar batch of reports or dones that both sides hand around (:class:`Rows`). A hub
(:mod:`mxlbbsp.relay.hub`) speaks them with both: to its relays it is the coordinator, to
the coordinator one relay, whose sections are its relays' merged (:func:`merge_rows`).

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
    FORECAST <q iteration, q count> + count int64 ranks, float64 forecasts and int64
             fallback counts: the relay's predictor's forecasts of these workers' speeds at
             iteration + 1 (when a section of reports left before the last of the host's
             reports of the iteration came; else they are its ``_forecast`` and
             ``_fallbacks`` columns), always ahead of the reports in the same write
    STATE    a JSON object: ``iteration``, ``ranks`` and the relay's predictor's ``state``
             after it learnt that iteration (at the coordinator's checkpoints)
coordinator -> relay
    CONFIG   a JSON object: ``hold_s``, how long the relay may hold a section back waiting
             for the rest of its workers (0: flush once the messages at hand are read),
             ``done_hold_s``, how long a complete section of dones may wait for the host's
             next reports, and ``checkpoint_every``, the coordinator's checkpoint period
             (0: none; those iterations' dones, and the predictor's STATE, leave at once); once
             every worker has said hello, ``forecast``: the predictor the relay runs over its
             workers, and from which iteration (see :mod:`mxlbbsp.relay.forecast`)
    TO_RANK  <i4 rank> + one JSON line, for that worker
    TO_ALL   one JSON line, for every worker of the relay
    SLICES   <q iteration, q total, q count> + count int64 ranks, offsets and sizes: the
             ``slice`` line of each of these workers (the slices of one split, one frame
             per host)
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
_FORECAST_HEAD = struct.Struct("<qq")
#: the longest frame read (a section of ~10 000 workers' reports)
MAX_FRAME = 1 << 24

ROWS, FORWARD, LOST, FORECAST, STATE = 1, 2, 3, 4, 5
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


class SliceFrames:
    """The SLICES frames of a split for several groups of ranks (one frame per relay), written
    in arrays: one int64 buffer holds the frames one after the other, their fixed words
    (header, count, ranks) written once; :meth:`fill` writes a split's iteration, total and
    every slot's offset and size in four indexed assignments. ``ranks``: every slot's rank,
    group after group; ``bounds``: each group's frame in the buffer's bytes, (start, end)."""

    def __init__(self, groups: Sequence[np.ndarray]):
        blocks, self.bounds, head, offsets, sizes = [], [], [], [], []
        at = 0
        for ranks in groups:
            k = len(ranks)
            words = 1 + 3 + 3 * k                   # header, iteration/total/count, columns
            block = np.zeros(words, dtype="<i8")
            block[0] = SLICES | ((words - 1) * 8) << 32       # HEADER: kind u8, 3 pad, u32
            block[3] = k
            block[4:4 + k] = ranks
            blocks.append(block)
            self.bounds.append((8 * at, 8 * (at + words)))
            head.append(at + 1)
            offsets.append(at + 4 + k + np.arange(k))
            sizes.append(at + 4 + 2 * k + np.arange(k))
            at += words
        self._buffer = np.concatenate(blocks) if blocks else np.zeros(0, dtype="<i8")
        self._head = np.array(head, dtype=np.intp)
        self._offsets, self._sizes = (np.concatenate(x).astype(np.intp) if x
                                      else np.zeros(0, dtype=np.intp) for x in (offsets, sizes))
        self.ranks = np.concatenate(groups).astype(np.int64) if len(groups) \
            else np.zeros(0, dtype=np.int64)

    def fill(self, iteration: int, total: int, offsets: np.ndarray, sizes: np.ndarray) -> bytes:
        """Every group's frame of the split of ``iteration`` (``total`` samples), one after the
        other: ``offsets`` and ``sizes`` one per slot, in the order of ``ranks``."""
        buffer = self._buffer
        buffer[self._head] = iteration
        buffer[self._head + 1] = total
        buffer[self._offsets] = offsets
        buffer[self._sizes] = sizes
        return buffer.tobytes()


def slices_frame(iteration: int, total: int, ranks: np.ndarray, offsets: np.ndarray,
                 sizes: np.ndarray) -> bytes:
    """One SLICES frame: workers ``ranks``' slices, their ``offsets`` and ``sizes``."""
    return SliceFrames([np.asarray(ranks)]).fill(iteration, total, offsets, sizes)


def read_slices(body) -> Tuple[int, int, np.ndarray]:
    """(iteration, total, the (3, count) int64 rows: ranks, offsets, sizes) of a SLICES
    frame."""
    if len(body) < _SLICES_HEAD.size:
        raise FrameError("a SLICES frame of the wrong length")
    iteration, total, count = _SLICES_HEAD.unpack_from(body)
    if count < 0 or len(body) != 24 + 24 * count:
        raise FrameError("a SLICES frame of the wrong length")
    return iteration, total, np.frombuffer(body, "<i8", 3 * count, 24).reshape(3, count)


def slice_lines(body) -> List[Tuple[int, bytes]]:
    """(rank, its ``slice`` line) of each worker of a SLICES frame."""
    iteration, total, data = read_slices(body)
    data = data.tolist()
    line = P.slice_line
    return [(r, line(iteration, o, s, total)) for r, o, s in zip(*data)]


def forecast_frame(iteration: int, ranks, forecasts, fallbacks) -> bytes:
    body = b"".join((_FORECAST_HEAD.pack(iteration, len(ranks)),
                     np.ascontiguousarray(ranks, "<i8").tobytes(),
                     np.ascontiguousarray(forecasts, "<f8").tobytes(),
                     np.ascontiguousarray(fallbacks, "<i8").tobytes()))
    return frame(FORECAST, body)


def read_forecast(body) -> Tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(iteration, ranks, forecasts, fallback counts) of a FORECAST frame."""
    if len(body) < _FORECAST_HEAD.size:
        raise FrameError("a FORECAST frame of the wrong length")
    iteration, count = _FORECAST_HEAD.unpack_from(body)
    if count < 0 or len(body) != 16 + 24 * count:
        raise FrameError("a FORECAST frame of the wrong length")
    return (iteration, np.frombuffer(body, "<i8", count, 16),
            np.frombuffer(body, "<f8", count, 16 + 8 * count),
            np.frombuffer(body, "<i8", count, 16 + 16 * count))


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


def _head(body) -> Tuple[int, int, int, int, bytes, int]:
    """A ROWS body's head: (what, column count, row count, iteration, the names block, where
    the int64 block starts); struct.error for a body shorter than its head."""
    what, ncols, k, t, names_len = _ROWS_HEAD.unpack_from(body)
    names = body[_ROWS_HEAD.size:_ROWS_HEAD.size + names_len]
    return what, ncols, k, t, names, _ROWS_HEAD.size + names_len + _pad(names_len)


def rows_head(body) -> Tuple[int, int, np.ndarray]:
    """(what: 0 reports, 1 dones; its iteration; its ranks) of a ROWS body."""
    try:
        what, _, k, t, _, at = _head(body)
        return what, t, np.frombuffer(body, "<i8", k, at)
    except (struct.error, ValueError) as exc:
        raise FrameError(f"a malformed section ({exc})") from None


def merge_rows(parts: Sequence[Tuple[bytes, float]]) -> List[bytes]:
    """ROWS frames of the sections ``parts``, (ROWS body, seconds it has waited since it was
    read), as few as there are kinds of section (type, iteration and columns): one section of
    all their rows, in the order the parts came, each row's wait grown by its part's. What a
    hub (:mod:`mxlbbsp.relay.hub`) sends for its relays' sections; the rows read back as they
    were sent. FrameError for a malformed body."""
    groups: Dict[tuple, list] = {}
    for body, waited in parts:
        try:
            what, ncols, k, t, names, at = _head(body)
            block = np.frombuffer(body, "<i8", (2 + _signature(names).numeric) * k,
                                  at).reshape(-1, k)
        except (struct.error, ValueError) as exc:
            raise FrameError(f"a malformed section ({exc})") from None
        groups.setdefault((what, ncols, t, names), []).append(
            (k, block, body[at + block.nbytes:], waited))
    out = []
    for (what, ncols, t, names), items in groups.items():
        block = np.concatenate([b for _, b, _, _ in items], axis=1)
        if any(w for _, _, _, w in items):
            block[1].view("<f8")[:] += np.repeat([w for _, _, _, w in items],
                                                 [k for k, _, _, _ in items])
        parts_out = [_ROWS_HEAD.pack(what, ncols, block.shape[1], t, len(names)),
                     names + b"\0" * _pad(len(names)), block.tobytes()]
        if len(items) == 1:
            parts_out.append(items[0][2])
        else:
            try:
                parts_out += _merge_texts([(k, tail) for k, _, tail, _ in items],
                                          _signature(names))
            except ValueError as exc:
                raise FrameError(f"a malformed section ({exc})") from None
        out.append(frame(ROWS, b"".join(parts_out)))
    return out


def _merge_texts(items: List[Tuple[int, bytes]], sig: "_Signature") -> List[bytes]:
    """The ``j`` columns of several sections' tails (what follows their int64 blocks), as
    one section's."""
    columns: List[Tuple[list, list]] = [([], []) for kind in sig.kinds if kind == "j"]
    for k, tail in items:
        at = 0
        for lengths_all, blobs in columns:
            lengths = np.frombuffer(tail, "<i8", k, at)
            at += 8 * k
            size = int(lengths.sum())
            lengths_all.append(lengths)
            blobs.append(tail[at:at + size])
            at += size + _pad(size)
        if at != len(tail):
            raise FrameError("a section of the wrong length")
    out = []
    for lengths_all, blobs in columns:
        blob = b"".join(blobs)
        out += [np.concatenate(lengths_all).astype("<i8").tobytes(), blob, b"\0" * _pad(len(blob))]
    return out


class _Signature:
    """The columns of a section, parsed once per distinct names block (a relay sends the
    same few again and again): their names and kinds, where each numeric one sits in the
    int64 block, and the plans of :meth:`Rows.matrix` made for it."""

    __slots__ = ("keys", "kinds", "where", "numeric", "plans")

    def __init__(self, keys: tuple, kinds: str):
        self.keys, self.kinds = keys, kinds
        self.where: Dict[str, Tuple[Optional[int], str]] = {}
        j = 2
        for key, kind in zip(keys, kinds):
            self.where[key] = (j, kind) if kind in "ifb" else (None, kind)
            j += kind in "ifb"
        self.numeric = j - 2
        self.plans: Dict[tuple, tuple] = {}

    def plan(self, keys: tuple) -> tuple:
        """How :meth:`Rows.matrix` reads ``keys``: (positions of the float rows, their rows in
        the block; of the integer rows, theirs; the positions of the rows of NaN; the JSON
        ones), None when a key is of kind ``j``."""
        got = self.plans.get(keys)
        if got is None:
            parts: Tuple[list, list, list, list, list, list] = ([], [], [], [], [], [])
            for i, key in enumerate(keys):
                j, kind = self.where.get(key, (None, "n"))
                if kind == "f":
                    parts[0].append(i)
                    parts[1].append(j)
                elif kind in "ib":
                    parts[2].append(i)
                    parts[3].append(j)
                elif kind == "n":
                    parts[4].append(i)
                else:
                    parts[5].append(i)
            got = self.plans[keys] = tuple(np.array(x, dtype=np.intp) for x in parts)
        return got


_SIGNATURES: Dict[bytes, _Signature] = {}


def _signature(blob: bytes) -> _Signature:
    got = _SIGNATURES.get(blob)
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
        got = _Signature(keys, "".join(x[0] for x in items))
        if len(_SIGNATURES) > 256:
            _SIGNATURES.clear()
        _SIGNATURES[blob] = got
    return got


def decode_rows(body: bytes, received: float) -> "Rows":
    """A ROWS frame's body as :class:`Rows`; ``received``: when it was read (time.time())."""
    try:
        what, ncols, k, t, names, at = _head(body)
        sig = _signature(names)
        if len(sig.keys) != ncols or what >= len(BATCHED):
            raise FrameError("a section whose head and names disagree")
        block = np.frombuffer(body, "<i8", (2 + sig.numeric) * k, at).reshape(-1, k)
        at += block.nbytes
        texts: Dict[str, list] = {}
        if "j" in sig.kinds:
            for key, kind in zip(sig.keys, sig.kinds):
                if kind == "j":
                    lengths = np.frombuffer(body, "<i8", k, at).tolist()
                    at += 8 * k
                    if min(lengths, default=0) < 0:
                        raise FrameError("a negative length")
                    cells, pos = [], at
                    for n in lengths:
                        cells.append(body[pos:pos + n])
                        pos += n
                    texts[key] = cells
                    at = pos + _pad(pos - at)
        if at != len(body):
            raise FrameError("a section of the wrong length")
    except (struct.error, ValueError) as exc:
        raise FrameError(f"a malformed section ({exc})") from None
    rows = Rows(BATCHED[what], t, block[0], sig)
    rows.received = received - block[1].view("<f8")
    rows._block, rows._texts = block, texts
    return rows


class Rows:
    """Reports, or dones, of one iteration from some workers: the batch the coordinator
    handles as arrays (one section of a relay, or one message of a worker connected
    directly: :meth:`from_messages`).

    ``ranks`` (int64), ``received`` (float64: when each message reached the first of
    mxlbbsp's processes it went through, time.time()); the fields as columns
    (:meth:`matrix`, :meth:`floats`, :meth:`values`) or as the messages (:meth:`dicts`).
    """

    __slots__ = ("what", "iteration", "ranks", "received", "_sig", "_block", "_texts",
                 "_dicts")

    def __init__(self, what: str, iteration: int, ranks: np.ndarray,
                 sig: Optional[_Signature] = None):
        self.what, self.iteration, self.ranks = what, iteration, ranks
        self._sig = sig
        self._block: Optional[np.ndarray] = None
        self._texts: Dict[str, list] = {}
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
        rows = cls(msg0["type"], msg0["iteration"], np.asarray(ranks, dtype=np.int64))
        rows.received = np.full(len(messages), received)
        if rows.what == P.REPORT:
            for msg in messages:
                msg["time"] = received
        rows._dicts = list(messages)
        return rows

    def kind(self, key: str) -> Optional[str]:
        """The kind of field ``key`` (None: absent; ``j`` for anything but one number kind
        in every row)."""
        if self._sig is None:
            kinds = {_kind(m[key]) if key in m else None for m in self._dicts}
            return kinds.pop() if len(kinds) == 1 else "j"
        return self._sig.where.get(key, (None, None))[1]

    def values(self, key: str) -> list:
        """Field ``key`` of every row as Python values (None: null or absent)."""
        if self._sig is None:
            return [m.get(key) for m in self._dicts]
        j, kind = self._sig.where.get(key, (None, "n"))
        if kind == "n":
            return [None] * len(self)
        if kind == "j":
            return [json.loads(x) for x in self._texts[key]]
        values = self._block[j].view("<f8") if kind == "f" else self._block[j]
        values = values.tolist()
        return [bool(x) for x in values] if kind == "b" else values

    def floats(self, key: str) -> np.ndarray:
        """Field ``key`` as floats (NaN: null or absent); ValueError/TypeError for a value
        that is not a number."""
        return self.matrix((key,))[0]

    def matrix(self, keys: tuple) -> np.ndarray:
        """Fields ``keys`` as a (len(keys), rows) float array (NaN: null or absent; a bool
        as 0/1); ValueError/TypeError for a value that is not a number."""
        if self._sig is None:
            return np.array([[_nan(m.get(key)) for m in self._dicts] for key in keys],
                            dtype=float)
        fpos, frows, ipos, irows, npos, jpos = self._sig.plan(keys)
        out = np.empty((len(keys), len(self)))
        if len(fpos):
            out[fpos] = self._block[frows].view("<f8")
        if len(ipos):
            out[ipos] = self._block[irows]
        if len(npos):
            out[npos] = np.nan
        for i in jpos.tolist():
            out[i] = [_nan(v) for v in self.values(keys[i])]
        return out

    def dicts(self) -> List[dict]:
        """Every row as the message it was (``type``, ``iteration``, then its fields; a
        report also with its ``time``, when it reached mxlbbsp)."""
        if self._dicts is None:
            k = len(self)
            keys = ("type", "iteration") + self._sig.keys
            columns = [[self.what] * k, [self.iteration] * k]
            columns += [self.values(key) for key in self._sig.keys]
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
