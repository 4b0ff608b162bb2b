"""A real draft proxy: the drafter in another OS process (or thread), frames over a socket.

Topology. The verifier (this process) and the drafter share one duplex
``multiprocessing.Pipe`` -- a Unix socketpair. Each round the verifier sends the drafter a
job (the round's proposals and q, pickled: verifier -> drafter only); the drafter encodes one
frame per request (``pp3cli.wire.frames``), keeping its own per-request generation and sequence,
sends each frame as one message, then an end-of-round marker naming the round and how many
frames it sent. The verifier never unpickles anything from the drafter: it reads raw bytes
(bounded in size) and hands them to a :class:`~pp3cli.wire.receiver.DraftReceiver`, which
validates them and falls back to target-only verification for any request without a
valid frame. A round ends at its end marker, at a deadline, or when the drafter is gone
(EOF); nothing blocks beyond the deadline.

``faults`` make the drafter misbehave on purpose (tests, negative controls): drop,
corrupt, truncate, send a stale generation, replay an earlier round's frame, send a
frame for a request the verifier does not own, break the q mass, or crash mid-round.

:func:`send_drafts_through_proxy` is the hook ``pp3 qualify --via-proxy`` calls: every
row's draft goes through the real process proxy and comes back as received.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Final, Literal

import crc32c
import numpy as np
import numpy.typing as npt

from pp3cli.wire.frames import HEADER_SIZE, MIN_FRAME_SIZE, ArrayLike, encode_frames, seal
from pp3cli.wire.receiver import DraftReceiver, Refusal, RoundInputs

if TYPE_CHECKING:
    import torch

    from pp3kernels import ChainInputs

LOGGER = logging.getLogger(__name__)

END_MAGIC: Final = b"PP3E"
END = struct.Struct("<4sQI")  # magic, round index, frames sent; then CRC32C
END_SIZE: Final = END.size + 4

FaultKind = Literal[
    "drop", "corrupt", "truncate", "stale_generation", "replay", "foreign", "bad_mass", "crash"
]
Mode = Literal["process", "thread"]


@dataclass(frozen=True)
class Fault:
    """One planted misbehaviour of the drafter at (round, request).

    ``crash``: the drafter dies just before sending this request's frame (a process exits
    with code 17 without closing anything; a thread closes its end of the socket).
    ``foreign``: the frame is sent under ``foreign_request_id`` instead of the request's id.
    ``replay``: the request's frame from round ``round_index - 1`` is sent again.
    """

    kind: FaultKind
    round_index: int
    request_id: int
    foreign_request_id: int = 0


@dataclass
class DraftJob:
    """What the drafter is asked to send in one round (pickled verifier -> drafter)."""

    round_index: int
    request_ids: list[int]
    generations: list[int]
    draft_tokens: npt.NDArray[np.int32]
    q_ids: npt.NDArray[np.int32]
    q_counts: npt.NDArray[np.int32]
    temperature: npt.NDArray[np.float32]
    denominator: int


def _end_marker(round_index: int, frames_sent: int) -> bytes:
    return seal(END.pack(END_MAGIC, round_index, frames_sent))


def _parse_end_marker(message: bytes) -> tuple[int, int] | None:
    """(round, frames sent) if ``message`` is a well-sealed end marker, else None."""
    if len(message) != END_SIZE or message[:4] != END_MAGIC:
        return None
    if crc32c.crc32c(message[:-4]) != int.from_bytes(message[-4:], "little"):
        return None
    _, round_index, frames_sent = END.unpack_from(message, 0)
    return int(round_index), int(frames_sent)


class _Crash(Exception):
    """Raised inside the drafter loop to simulate death."""


def _apply_fault(
    fault: Fault, frame: bytes, job: DraftJob, row: int, previous: dict[int, bytes]
) -> bytes | None:
    """The bytes actually sent for one row under ``fault`` (None: nothing is sent)."""
    if fault.kind == "drop":
        return None
    if fault.kind == "crash":
        raise _Crash
    if fault.kind == "corrupt":
        damaged = bytearray(frame)
        damaged[HEADER_SIZE + 1] ^= 0x40  # inside the proposals; CRC left as it was
        return bytes(damaged)
    if fault.kind == "truncate":
        return frame[: len(frame) // 2]
    if fault.kind == "replay":
        return previous.get(job.request_ids[row], b"")

    def reencode(
        request_id: int, generation: int, counts: npt.NDArray[np.int32], sequence: int
    ) -> bytes:
        return encode_frames(
            job.draft_tokens[row : row + 1],
            job.q_ids[row : row + 1],
            counts,
            denominator=job.denominator,
            temperature=job.temperature[row : row + 1],
            request_ids=request_id,
            generation=generation,
            sequence=sequence,
        )[0]

    sequence = int.from_bytes(frame[24:32], "little")
    counts = job.q_counts[row : row + 1].copy()
    rid, generation = job.request_ids[row], job.generations[row]
    if fault.kind == "stale_generation":
        return reencode(rid, generation - 1, counts, sequence)
    if fault.kind == "foreign":
        return reencode(fault.foreign_request_id, generation, counts, sequence)
    if fault.kind == "bad_mass":
        listed = np.argwhere(counts[0] > 0)
        if len(listed):
            k, s = listed[0]
            counts[0, k, s] -= 1
        return reencode(rid, generation, counts, sequence)
    raise ValueError(f"unknown fault kind {fault.kind!r}")


def drafter_loop(conn: Connection, faults: tuple[Fault, ...], *, exit_on_crash: bool) -> None:
    """The drafter: for each job, encode and send one frame per request, then an end marker.

    Keeps its own per-request (generation, next sequence): a new generation restarts the
    sequence at 0, as the receiver expects.
    """
    planted = {(f.round_index, f.request_id): f for f in faults}
    sequences: dict[int, tuple[int, int]] = {}
    last_frame: dict[int, bytes] = {}
    try:
        while True:
            try:
                job = conn.recv()
            except EOFError:
                return
            if job is None:
                return
            if not isinstance(job, DraftJob):
                raise TypeError(f"drafter: expected a DraftJob, got {type(job)!r}")
            seqs = []
            for rid, gen in zip(job.request_ids, job.generations, strict=True):
                known = sequences.get(rid)
                seq = known[1] if known is not None and known[0] == gen else 0
                sequences[rid] = (gen, seq + 1)
                seqs.append(seq)
            frames = encode_frames(
                job.draft_tokens,
                job.q_ids,
                job.q_counts,
                denominator=job.denominator,
                temperature=job.temperature,
                request_ids=np.array(job.request_ids, dtype=np.uint64),
                generation=np.array(job.generations, dtype=np.uint64),
                sequence=np.array(seqs, dtype=np.uint64),
            )
            sent = 0
            for row, frame in enumerate(frames):
                rid = job.request_ids[row]
                fault = planted.get((job.round_index, rid))
                message = (
                    frame if fault is None else _apply_fault(fault, frame, job, row, last_frame)
                )
                last_frame[rid] = frame
                if message is not None:
                    conn.send_bytes(message)
                    sent += 1
            conn.send_bytes(_end_marker(job.round_index, sent))
    except _Crash:
        if exit_on_crash:
            import os

            os._exit(17)  # die like a crashed process: no flush, no goodbye
    finally:
        conn.close()


def _drafter_process_main(conn: Connection, faults: tuple[Fault, ...]) -> None:
    drafter_loop(conn, faults, exit_on_crash=True)


@dataclass
class ProxyStats:
    """What went through the proxy: frames each way, refusals with reasons, fallbacks."""

    mode: str
    rounds: int = 0
    frames_sent: int = 0  # as declared by the drafter's end markers
    frames_received: int = 0
    frames_accepted: int = 0
    frames_refused: int = 0
    fallbacks: int = 0
    rounds_timed_out: int = 0
    drafter_lost: bool = False
    drafter_exitcode: int | None = None
    refused_by_reason: Counter[str] = field(default_factory=Counter)
    fallback_by_reason: Counter[str] = field(default_factory=Counter)
    refusals: list[Refusal] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain dict for a receipt (``via_proxy`` block): the first 100 refusals in full."""
        plain: dict[str, Any] = dict(vars(self))
        plain["refused_by_reason"] = dict(self.refused_by_reason)
        plain["fallback_by_reason"] = dict(self.fallback_by_reason)
        plain["refusals"] = [r.to_json() for r in self.refusals[:100]]
        return plain


class DraftProxy:
    """The verifier's end of a drafter running in another process (or a thread).

    Use as a context manager; on exit the drafter is told to stop, joined with a timeout,
    and a process that does not stop is terminated, then killed.
    """

    def __init__(
        self,
        *,
        mode: Mode = "process",
        faults: tuple[Fault, ...] = (),
        round_timeout_s: float = 30.0,
    ) -> None:
        if mode not in ("process", "thread"):
            raise ValueError(f"mode {mode!r}: expected 'process' or 'thread'")
        if round_timeout_s <= 0:
            raise ValueError(f"round_timeout_s {round_timeout_s}: expected > 0")
        self.mode = mode
        self.faults = faults
        self.round_timeout_s = round_timeout_s
        self.stats = ProxyStats(mode=mode)
        self._conn: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> DraftProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the drafter (spawned process or thread) on a fresh socketpair."""
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe(duplex=True)
        self._conn = ours
        if self.mode == "process":
            process = ctx.Process(
                target=_drafter_process_main,
                args=(theirs, self.faults),
                name="pp3-drafter",
                daemon=True,
            )
            process.start()
            theirs.close()  # the child holds its own copy
            self._process = process
        else:
            thread = threading.Thread(
                target=drafter_loop,
                args=(theirs, self.faults),
                kwargs={"exit_on_crash": False},
                name="pp3-drafter",
                daemon=True,
            )
            thread.start()
            self._thread = thread

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the drafter and release the socket; never leaves a process behind."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        if self._process is not None:
            self._process.join(timeout_s)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join(timeout_s)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(timeout_s)
            self.stats.drafter_exitcode = self._process.exitcode
            self._process.close()
            self._process = None
        if conn is not None:
            conn.close()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def run_round(self, receiver: DraftReceiver, job: DraftJob) -> RoundInputs:
        """Send ``job`` to the drafter, collect its frames, and let ``receiver`` judge them."""
        frames: list[bytes] = []
        conn = self._conn
        if conn is None:
            raise RuntimeError("proxy not started")
        limit = MIN_FRAME_SIZE + 8 * receiver.num_positions * (1 + receiver.support_width)
        if not self.stats.drafter_lost:
            try:
                conn.send(job)
            except (OSError, ValueError):
                self._lost("the drafter's socket is closed")
        deadline = time.monotonic() + self.round_timeout_s
        while not self.stats.drafter_lost:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0 or not conn.poll(remaining):
                    self.stats.rounds_timed_out += 1
                    LOGGER.warning(
                        "round %d: no end marker within %.1f s",
                        job.round_index,
                        self.round_timeout_s,
                    )
                    break
                message = conn.recv_bytes(limit)
            except (EOFError, OSError) as err:
                self._lost(f"connection ended in round {job.round_index} ({err!r})")
                break
            end = _parse_end_marker(message)
            if end is None:
                frames.append(message)
                continue
            if end[0] == job.round_index:
                self.stats.frames_sent += end[1]
                break
            LOGGER.warning("round %d: ignoring end marker of round %d", job.round_index, end[0])
        self.stats.frames_received += len(frames)
        inputs = receiver.receive_round(job.request_ids, frames)
        self.stats.rounds += 1
        self.stats.refusals.extend(inputs.refusals)
        for refusal in inputs.refusals:
            if refusal.fallback:
                self.stats.fallbacks += 1
                self.stats.fallback_by_reason[refusal.reason] += 1
            else:
                self.stats.frames_refused += 1
                self.stats.refused_by_reason[refusal.reason] += 1
        self.stats.frames_accepted += int((~inputs.fallback).sum())
        return inputs

    def _lost(self, why: str) -> None:
        self.stats.drafter_lost = True
        LOGGER.warning("drafter lost: %s; its requests fall back to target-only", why)


def _to_numpy(array: ArrayLike) -> npt.NDArray[Any]:
    if isinstance(array, np.ndarray):
        return array
    result: npt.NDArray[Any] = array.detach().cpu().numpy()
    return result


def send_drafts_through_proxy(
    draft_tokens: ArrayLike,
    q_ids: ArrayLike,
    q_counts: ArrayLike,
    denominator: int,
    temperature: ArrayLike,
    request_ids: ArrayLike,
    generation: int,
    *,
    mode: Mode = "process",
    vocab_size: int | None = None,
    faults: tuple[Fault, ...] = (),
    round_size: int = 4096,
    round_timeout_s: float = 60.0,
) -> tuple[Any, Any, Any, ProxyStats]:
    """Send every row's draft through a real drafter process and return what was received.

    Rows are grouped into rounds of ``round_size`` requests (each request sends one frame,
    sequence 0, at ``generation``). Returns ``(draft_tokens, q_ids, q_counts, stats)`` of
    the same shapes as the inputs and the same kind (torch tensors on the input's device,
    or numpy). A row whose frame was refused or lost comes back as a fallback row (all
    proposals -1, all-padding q); ``stats.fallbacks`` counts them, so a qualification that
    expects the drafts intact must check ``stats.fallbacks == 0``.

    ``vocab_size`` bounds the ids the receiver accepts; pass the target's V (None accepts
    any id in [0, 2^31 - 1), which still checks everything else).
    """
    drafts = _to_numpy(draft_tokens)
    ids = _to_numpy(q_ids)
    counts = _to_numpy(q_counts)
    temps = _to_numpy(temperature).astype(np.float32)
    rids = _to_numpy(request_ids).astype(np.int64)
    batch, positions = drafts.shape
    support = ids.shape[2]
    if rids.shape != (batch,) or len(np.unique(rids)) != batch or (rids < 0).any():
        raise ValueError(f"request_ids: expected {batch} distinct non-negative ids")
    if round_size < 1:
        raise ValueError(f"round_size {round_size}: expected >= 1")
    receiver = DraftReceiver(
        slot="qualify-proxy",
        vocab_size=vocab_size if vocab_size is not None else (1 << 31) - 1,
        num_positions=positions,
        support_width=support,
        denominator=denominator,
    )
    rid_list = [int(r) for r in rids.tolist()]
    for rid, temp in zip(rid_list, temps.tolist(), strict=True):
        receiver.admit(rid, temperature=temp, generation=generation)
    out_drafts = np.empty((batch, positions), dtype=np.int32)
    out_ids = np.empty((batch, positions, support), dtype=np.int32)
    out_counts = np.empty((batch, positions, support), dtype=np.int32)
    with DraftProxy(mode=mode, faults=faults, round_timeout_s=round_timeout_s) as proxy:
        for round_index, start in enumerate(range(0, batch, round_size)):
            stop = min(start + round_size, batch)
            job = DraftJob(
                round_index=round_index,
                request_ids=rid_list[start:stop],
                generations=[generation] * (stop - start),
                draft_tokens=np.ascontiguousarray(drafts[start:stop], dtype=np.int32),
                q_ids=np.ascontiguousarray(ids[start:stop], dtype=np.int32),
                q_counts=np.ascontiguousarray(counts[start:stop], dtype=np.int32),
                temperature=np.ascontiguousarray(temps[start:stop]),
                denominator=denominator,
            )
            inputs = proxy.run_round(receiver, job)
            out_drafts[start:stop] = inputs.draft_tokens
            out_ids[start:stop] = inputs.q_ids
            out_counts[start:stop] = inputs.q_counts
    stats = proxy.stats
    if isinstance(draft_tokens, np.ndarray):
        return out_drafts, out_ids, out_counts, stats
    return (
        _like(out_drafts, draft_tokens),
        _like(out_ids, q_ids),
        _like(out_counts, q_counts),
        stats,
    )


def _like(array: npt.NDArray[np.int32], reference: ArrayLike) -> torch.Tensor:
    import torch

    if isinstance(reference, np.ndarray):
        return torch.from_numpy(array)
    return torch.from_numpy(array).to(device=reference.device)


class ProxyDraftTransport:
    """``pp3 qualify --via-proxy``: send every batch's drafts through a real drafter process.

    Implements qualify's ``DraftTransport``: the batch's drafts and sparse q travel as
    frames through ``send_drafts_through_proxy`` and come back as received. A lost or
    refused frame comes back as a fallback row (proposals -1), which changes the law, so
    the family sees it; nothing is patched up here. Frame counts add up in ``summary()``.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.totals: Counter[str] = Counter()
        self.refused_by_reason: Counter[str] = Counter()
        self.drafter_lost = 0

    def __call__(
        self, inputs: ChainInputs, request_index: torch.Tensor, generation: int, vocab: int
    ) -> ChainInputs:
        if inputs.q_ids is None or inputs.q_counts is None or inputs.denominator is None:
            raise ValueError("the drafter proxy carries sparse integer q only")
        drafts, ids, counts, stats = send_drafts_through_proxy(
            inputs.draft_tokens,
            inputs.q_ids.contiguous(),
            inputs.q_counts.contiguous(),
            inputs.denominator,
            inputs.temperature,
            request_index,
            generation,
            vocab_size=vocab,
        )
        record = stats.to_json()
        self.calls += 1
        for key in (
            "rounds",
            "frames_sent",
            "frames_received",
            "frames_accepted",
            "frames_refused",
            "fallbacks",
            "rounds_timed_out",
        ):
            self.totals[key] += int(record[key])
        self.refused_by_reason.update(record["refused_by_reason"])
        self.drafter_lost += int(bool(record["drafter_lost"]))
        return dataclasses.replace(inputs, draft_tokens=drafts, q_ids=ids, q_counts=counts)

    def summary(self) -> dict[str, Any]:
        """The receipt's ``proxy`` block: frames each way, refusals by reason, fallbacks."""
        return {
            "mode": "process",
            "calls": self.calls,
            **dict(self.totals),
            "refused_by_reason": dict(sorted(self.refused_by_reason.items())),
            "drafter_lost_calls": self.drafter_lost,
        }
