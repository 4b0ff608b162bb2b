"""Draft frames on the wire: one request's proposals and integer q counts for one round.

Layout version 1 (little-endian; the byte-level table is in docs/wire.md)::

    header   48 bytes  magic "PP3Q", version, flags (bit 0 = T0), request id, generation,
                       sequence, K, S, denominator C, temperature (fp32), frame length
    drafts   4K bytes  int32[K]   proposal ids, -1 = invalidated proposal
    lengths  4K bytes  uint32[K]  n_k = support size of position k (0 <= n_k <= S)
    ids      4N bytes  int32[N]   support ids, position-major, strictly increasing per position
    counts   4N bytes  int32[N]   integer q counts, each >= 1          (N = sum_k n_k)
    crc      4 bytes   uint32     CRC32C (Castagnoli) of every byte before it

Law carried by a frame: q_k(v) = counts_k[v] / C for v in the support of position k, 0
elsewhere. Validation (``decode_frame``) fails closed: a frame is either refused with a
typed :class:`WireError` naming the offending value, or decodes into arrays that satisfy

- every support id is in [0, V), strictly increasing within its position (so never
  duplicated), with a count >= 1 -- on every position, including positions whose q carries
  no mass (T0 rows and invalidated proposals);
- sum_v counts_k[v] == C, or == 0 only where the position needs no q (a T0 frame, or an
  invalidated proposal x_k = -1);
- a proposal x_k >= 0 lies in [0, V), and in a T1 frame q_k(x_k) > 0 (the selector's rule;
  a T0 request never reads q).

Per-request state (owner, generation, next sequence) is the receiver's job
(``pp3cli.wire.receiver``). Encoding and decoding are vectorised with numpy: no Python loop runs
per token, only per frame.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import crc32c
import numpy as np
import numpy.typing as npt

from pp3cli.run.errors import CheckFailed
from pp3kernels.contract import MAX_DENOMINATOR, NO_TOKEN, is_power_of_two_denominator

if TYPE_CHECKING:
    import torch

    ArrayLike = npt.NDArray[Any] | torch.Tensor
else:
    ArrayLike = Any

MAGIC: Final = b"PP3Q"
VERSION: Final = 1
FLAG_T0: Final = 0x0001
KNOWN_FLAGS: Final = FLAG_T0
# magic, version, flags, request id, generation, sequence, K, S, C, temperature, frame length
HEADER: Final = struct.Struct("<4sHHQQQHHIfI")
HEADER_SIZE: Final = HEADER.size  # 48
CRC_SIZE: Final = 4
MIN_FRAME_SIZE: Final = HEADER_SIZE + CRC_SIZE
MAX_U16: Final = 0xFFFF
MAX_U64: Final = (1 << 64) - 1

I32 = npt.NDArray[np.int32]


class WireError(CheckFailed):
    """A frame refused by validation. ``reason`` is a short stable code for counters/logs."""

    reason: str = "invalid"

    def __init__(self, message: str, *, request_id: int | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class TruncatedFrameError(WireError):
    """Fewer bytes than the header or the declared frame length requires."""

    reason = "truncated"


class FrameLengthError(WireError):
    """More bytes than declared, or a declared length inconsistent with K and n_k."""

    reason = "bad_length"


class BadMagicError(WireError):
    """The first four bytes are not b'PP3Q'."""

    reason = "bad_magic"


class UnsupportedVersionError(WireError):
    """A layout version this decoder does not implement."""

    reason = "bad_version"


class CrcMismatchError(WireError):
    """The CRC32C trailer does not match the frame bytes."""

    reason = "crc_mismatch"


class HeaderFieldError(WireError):
    """A header field out of its documented range (flags, K, S, C, temperature, n_k)."""

    reason = "bad_header"


class DraftIdRangeError(WireError):
    """A proposal id that is neither -1 nor in [0, V)."""

    reason = "draft_id_range"


class SupportIdRangeError(WireError):
    """A support id outside [0, V)."""

    reason = "support_id_range"


class DuplicateSupportError(WireError):
    """The same support id twice in one position."""

    reason = "duplicate_support"


class UnsortedSupportError(WireError):
    """Support ids of one position not strictly increasing."""

    reason = "unsorted_support"


class NonPositiveCountError(WireError):
    """A listed support entry with count <= 0 (the wire lists only entries with mass)."""

    reason = "bad_count"


class MassError(WireError):
    """Counts of a position do not sum to the denominator."""

    reason = "mass"


class MissingMassError(MassError):
    """Counts sum to less than C (or to 0 where the position needs q)."""

    reason = "missing_mass"


class ExtraMassError(MassError):
    """Counts sum to more than C."""

    reason = "extra_mass"


class ZeroCountProposalError(WireError):
    """A T1 proposal x_k >= 0 whose q_k(x_k) is 0 (x_k not in its position's support)."""

    reason = "zero_count_proposal"


@dataclass(frozen=True)
class FrameHeader:
    """The fixed header fields of a frame."""

    request_id: int
    generation: int
    sequence: int
    num_positions: int  # K
    support_width: int  # S
    denominator: int  # C
    temperature: float  # fp32 value; 0.0 <=> T0
    frame_length: int

    @property
    def is_t0(self) -> bool:
        """True for a greedy (temperature 0) request."""
        return self.temperature == 0.0


@dataclass(frozen=True)
class Frame:
    """A validated frame, as selector-input rows (S = header.support_width, -1/0 padding)."""

    header: FrameHeader
    draft_tokens: I32  # [K]
    q_ids: I32  # [K, S] strictly increasing ids, then -1 padding
    q_counts: I32  # [K, S] counts >= 1, then 0 padding


def _as_numpy(array: ArrayLike, name: str) -> npt.NDArray[Any]:
    """A numpy view (or copy) of a numpy array or a torch tensor (any device)."""
    if isinstance(array, np.ndarray):
        return array
    detach = getattr(array, "detach", None)
    if detach is None:
        raise TypeError(f"{name}: expected a numpy array or torch tensor, got {type(array)!r}")
    result: npt.NDArray[Any] = detach().cpu().numpy()
    return result


def _check_denominator(denominator: int, request_id: int | None = None) -> None:
    """The contract's denominator rule (``pp3kernels.contract``), refused as a header error."""
    if not is_power_of_two_denominator(denominator):
        raise HeaderFieldError(
            f"denominator {denominator}: expected a power of two in [1, {MAX_DENOMINATOR}]",
            request_id=request_id,
        )


def _broadcast_u64(value: int | ArrayLike, batch: int, name: str) -> list[int]:
    if isinstance(value, int) and not 0 <= value <= MAX_U64:  # numpy would say "object"
        raise ValueError(f"{name}: {value} does not fit an unsigned 64-bit field")
    raw = np.asarray(value) if isinstance(value, int) else _as_numpy(value, name)
    array = np.broadcast_to(raw, (batch,))
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got dtype {array.dtype}")
    values = [int(v) for v in array.tolist()]
    for v in values:
        if not 0 <= v <= MAX_U64:
            raise ValueError(f"{name}: {v} does not fit an unsigned 64-bit field")
    return values


def encode_frames(
    draft_tokens: ArrayLike,
    q_ids: ArrayLike,
    q_counts: ArrayLike,
    *,
    denominator: int,
    temperature: ArrayLike,
    request_ids: int | ArrayLike,
    generation: int | ArrayLike,
    sequence: int | ArrayLike,
) -> list[bytes]:
    """Encode a batch of selector inputs as one frame per request (row b -> frames[b]).

    Inputs follow the selector contract: ``draft_tokens`` [B, K] int, ``q_ids``/``q_counts``
    [B, K, S] int (padding id -1, count 0), ``temperature`` [B] (0 = T0). Entries with count
    0 carry no mass and are not transmitted; the rest are sorted by id within each position
    (the wire's canonical order), so the decoded q is the same law as the input q.

    The encoder is a transport: it checks shapes and header ranges but transmits content as
    given (a malformed q is the receiver's to refuse, fail closed).
    """
    drafts = np.ascontiguousarray(_as_numpy(draft_tokens, "draft_tokens"))
    ids = _as_numpy(q_ids, "q_ids")
    counts = _as_numpy(q_counts, "q_counts")
    temps = np.ascontiguousarray(_as_numpy(temperature, "temperature"), dtype=np.float32)
    if drafts.ndim != 2:
        raise ValueError(f"draft_tokens: expected shape [B, K], got {tuple(drafts.shape)}")
    batch, positions = drafts.shape
    if ids.ndim != 3 or ids.shape[:2] != (batch, positions) or counts.shape != ids.shape:
        raise ValueError(
            f"q_ids {tuple(ids.shape)} / q_counts {tuple(counts.shape)}: expected [B, K, S] "
            f"with B, K = {batch}, {positions}"
        )
    support = ids.shape[2]
    if temps.shape != (batch,):
        raise ValueError(f"temperature: expected shape [{batch}], got {tuple(temps.shape)}")
    if not (1 <= positions <= MAX_U16 and 1 <= support <= MAX_U16):
        raise ValueError(f"K = {positions}, S = {support}: each must be in [1, {MAX_U16}]")
    for name, array in (("draft_tokens", drafts), ("q_ids", ids), ("q_counts", counts)):
        if array.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected an integer dtype, got {array.dtype}")
    _check_denominator(denominator)
    requests = _broadcast_u64(request_ids, batch, "request_ids")
    generations = _broadcast_u64(generation, batch, "generation")
    sequences = _broadcast_u64(sequence, batch, "sequence")

    # Canonical order: listed entries (count != 0) sorted by id, then the unlisted ones.
    ids64 = ids.astype(np.int64)
    listed = counts != 0
    key = np.where(listed, ids64, np.iinfo(np.int64).max)
    order = np.argsort(key, axis=-1, kind="stable")
    sorted_ids = np.take_along_axis(ids64, order, axis=-1)
    sorted_counts = np.take_along_axis(counts.astype(np.int64), order, axis=-1)
    lengths = listed.sum(axis=-1).astype(np.uint32)  # [B, K]
    in_support = np.arange(support) < lengths[..., None]
    flat_ids = sorted_ids[in_support].astype(np.int32)  # all frames, row-major
    flat_counts = sorted_counts[in_support].astype(np.int32)
    if flat_ids.size and (sorted_ids[in_support] != flat_ids).any():
        raise ValueError("q_ids: a support id does not fit int32")
    if flat_counts.size and (sorted_counts[in_support] != flat_counts).any():
        raise ValueError("q_counts: a count does not fit int32")
    drafts32 = drafts.astype(np.int32)
    if (drafts32 != drafts).any():
        raise ValueError("draft_tokens: a proposal id does not fit int32")
    per_frame = lengths.sum(axis=1, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(per_frame))).tolist()
    ids_bytes = flat_ids.tobytes()
    counts_bytes = flat_counts.tobytes()
    t0 = (temps == 0.0).tolist()
    temp_list = temps.tolist()

    frames: list[bytes] = []
    for b in range(batch):
        start, stop = offsets[b], offsets[b + 1]
        length = MIN_FRAME_SIZE + 8 * positions + 8 * (stop - start)
        header = HEADER.pack(
            MAGIC,
            VERSION,
            FLAG_T0 if t0[b] else 0,
            requests[b],
            generations[b],
            sequences[b],
            positions,
            support,
            denominator,
            temp_list[b],
            length,
        )
        body = b"".join(
            (
                header,
                drafts32[b].tobytes(),
                lengths[b].tobytes(),
                ids_bytes[4 * start : 4 * stop],
                counts_bytes[4 * start : 4 * stop],
            )
        )
        frames.append(body + crc32c.crc32c(body).to_bytes(4, "little"))
    return frames


def seal(body: bytes) -> bytes:
    """Append the CRC32C trailer to ``body`` (tests use it to forge well-sealed bad frames)."""
    return body + crc32c.crc32c(body).to_bytes(4, "little")


def read_header(buffer: bytes) -> FrameHeader:
    """Parse and check the header: length, magic, version, CRC, then each field's range.

    Raises the first applicable :class:`WireError`; ``request_id`` is set on errors found
    after the CRC check (before it, the claimed id is unauthenticated and is only named in
    the message).
    """
    size = len(buffer)
    if size < MIN_FRAME_SIZE:
        raise TruncatedFrameError(
            f"frame of {size} bytes: expected at least {MIN_FRAME_SIZE} (header + CRC)"
        )
    (magic, version, flags, request_id, generation, sequence, positions, support, denominator,
     temperature, length) = HEADER.unpack_from(buffer, 0)  # fmt: skip
    if magic != MAGIC:
        raise BadMagicError(f"magic {magic!r}: expected {MAGIC!r} (not a pp3 draft frame)")
    if version != VERSION:
        raise UnsupportedVersionError(
            f"layout version {version}: this decoder implements version {VERSION}"
        )
    if size < length:
        raise TruncatedFrameError(
            f"frame of {size} bytes for claimed request {request_id}: header declares {length}"
        )
    if size > length:
        raise FrameLengthError(
            f"frame of {size} bytes for claimed request {request_id}: header declares {length}"
        )
    stored = int.from_bytes(buffer[size - CRC_SIZE :], "little")
    computed = crc32c.crc32c(buffer[: size - CRC_SIZE])
    if stored != computed:
        raise CrcMismatchError(
            f"CRC32C {stored:#010x} for claimed request {request_id}: bytes hash to "
            f"{computed:#010x} (corrupted or partial frame)"
        )
    if flags & ~KNOWN_FLAGS:
        raise HeaderFieldError(
            f"flags {flags:#06x}: only bit 0 (T0) is defined", request_id=request_id
        )
    if not 1 <= positions or not 1 <= support:
        raise HeaderFieldError(
            f"K = {positions}, S = {support}: both must be >= 1", request_id=request_id
        )
    _check_denominator(denominator, request_id)
    if not np.isfinite(temperature) or temperature < 0.0:
        raise HeaderFieldError(
            f"temperature {temperature}: expected a finite value >= 0", request_id=request_id
        )
    if bool(flags & FLAG_T0) != (temperature == 0.0):
        raise HeaderFieldError(
            f"T0 flag {bool(flags & FLAG_T0)} with temperature {temperature}: the flag must "
            "be set exactly when the temperature is 0",
            request_id=request_id,
        )
    return FrameHeader(
        request_id=request_id,
        generation=generation,
        sequence=sequence,
        num_positions=positions,
        support_width=support,
        denominator=denominator,
        temperature=float(temperature),
        frame_length=length,
    )


@dataclass
class DecodedFrames:
    """A batch of frames after validation.

    ``errors[i]`` is None for a frame that passed every check, else the first check it
    failed (checks run in the order of docs/wire.md). The flat arrays hold the contents of
    the frames that passed, one entry per (frame, position) row and per support entry.
    """

    headers: list[FrameHeader | None]
    errors: list[WireError | None]
    drafts: I32  # [R] proposal of each row
    lengths: I32  # [R] support size n_k of each row
    row_frame: npt.NDArray[np.int64]  # [R] index into the batch of frames
    row_position: npt.NDArray[np.int64]  # [R] k
    ids: I32  # [N] support ids, row-major
    counts: I32  # [N]
    entry_row: npt.NDArray[np.int64]  # [N] row of each entry
    entry_slot: npt.NDArray[np.int64]  # [N] slot of each entry within its row

    def frame(self, index: int) -> Frame:
        """The padded rows ([K], [K, S], [K, S]) of one frame that passed validation."""
        header, error = self.headers[index], self.errors[index]
        if error is not None:
            raise error
        if header is None:  # unreachable: a frame without a header has an error
            raise ValueError(f"frame {index} has no header")
        positions, support = header.num_positions, header.support_width
        drafts = np.empty((1, positions), dtype=np.int32)
        q_ids = np.empty((1, positions, support), dtype=np.int32)
        q_counts = np.empty((1, positions, support), dtype=np.int32)
        target = np.full(len(self.headers), -1, dtype=np.int64)
        target[index] = 0
        self.scatter(target, drafts, q_ids, q_counts)
        return Frame(header=header, draft_tokens=drafts[0], q_ids=q_ids[0], q_counts=q_counts[0])

    def scatter(
        self,
        target_rows: npt.NDArray[np.int64],
        draft_tokens: npt.NDArray[np.int32],
        q_ids: npt.NDArray[np.int32],
        q_counts: npt.NDArray[np.int32],
    ) -> None:
        """Write frame i into batch row ``target_rows[i]`` (skip where it is -1).

        The target rows are first reset to padding (-1 ids, 0 counts); every written frame
        must have K equal to the batch's K and S no larger than the batch's S.
        """
        positions, support = q_ids.shape[1], q_ids.shape[2]
        if not (q_ids.flags["C_CONTIGUOUS"] and q_counts.flags["C_CONTIGUOUS"]):
            raise ValueError("q_ids and q_counts must be C-contiguous to be written in place")
        for i, row in enumerate(target_rows.tolist()):
            if row < 0:
                continue
            header = self.headers[i]
            if self.errors[i] is not None or header is None:
                raise ValueError(f"frame {i} failed validation and cannot be scattered")
            if header.num_positions != positions or header.support_width > support:
                raise ValueError(
                    f"frame {i}: K = {header.num_positions}, S = {header.support_width} does "
                    f"not fit a batch with K = {positions}, S = {support}"
                )
        rows = target_rows[target_rows >= 0]
        q_ids[rows] = NO_TOKEN
        q_counts[rows] = 0
        row_target = target_rows[self.row_frame]
        keep = row_target >= 0
        draft_tokens[row_target[keep], self.row_position[keep]] = self.drafts[keep]
        # Flat index of each entry: ((row * K) + k) * S + slot.
        row_base = (row_target * positions + self.row_position) * support
        entry_target = row_base[self.entry_row] + self.entry_slot
        keep_entry = row_target[self.entry_row] >= 0
        if not keep_entry.all():
            entry_target = entry_target[keep_entry]
        ids_flat = q_ids.reshape(-1)
        counts_flat = q_counts.reshape(-1)
        ids_flat[entry_target] = self.ids if keep_entry.all() else self.ids[keep_entry]
        counts_flat[entry_target] = self.counts if keep_entry.all() else self.counts[keep_entry]


def decode_frame(
    buffer: bytes,
    *,
    vocab_size: int,
    max_positions: int = 64,
    max_support: int = MAX_U16,
) -> Frame:
    """Decode and validate one frame against a vocabulary of ``vocab_size`` ids.

    Raises the first :class:`WireError` that applies; see :func:`decode_frames`.
    """
    decoded = decode_frames(
        [buffer], vocab_size=vocab_size, max_positions=max_positions, max_support=max_support
    )
    return decoded.frame(0)


def decode_frames(
    buffers: list[bytes],
    *,
    vocab_size: int,
    max_positions: int = 64,
    max_support: int = MAX_U16,
) -> DecodedFrames:
    """Decode and validate a batch of frames; one bad frame never affects another.

    Per frame, in order: header (:func:`read_header`), K <= ``max_positions`` and
    S <= ``max_support`` (bounds allocation before anything is read), n_k <= S, declared
    length == 52 + 8K + 8N, then the contents over all frames at once with numpy: support
    ids in [0, V), no duplicate, strictly increasing, counts >= 1 (on every position,
    including those without mass), proposals in {-1} U [0, V), mass == C (or 0 for T0 /
    x = -1), and q(x) > 0 for every T1 proposal x >= 0.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size {vocab_size}: expected >= 1")
    count = len(buffers)
    headers: list[FrameHeader | None] = [None] * count
    errors: list[WireError | None] = [None] * count
    for i, buffer in enumerate(buffers):
        try:
            header = read_header(buffer)
        except WireError as err:
            errors[i] = err
            continue
        headers[i] = header
        if header.num_positions > max_positions or header.support_width > max_support:
            errors[i] = HeaderFieldError(
                f"K = {header.num_positions}, S = {header.support_width}: this receiver "
                f"accepts K <= {max_positions}, S <= {max_support}",
                request_id=header.request_id,
            )
        elif header.frame_length < MIN_FRAME_SIZE + 8 * header.num_positions:
            errors[i] = FrameLengthError(
                f"declared length {header.frame_length} < "
                f"{MIN_FRAME_SIZE + 8 * header.num_positions} needed for "
                f"K = {header.num_positions}",
                request_id=header.request_id,
            )

    # Structure: n_k <= S and the declared length, for all surviving frames at once.
    live = [i for i in range(count) if errors[i] is None]
    live_headers = [h for h in (headers[i] for i in live) if h is not None]
    positions = np.array([h.num_positions for h in live_headers], dtype=np.int64)
    lengths = _frombuffer_i32(
        b"".join(
            buffers[i][HEADER_SIZE + 4 * h.num_positions : HEADER_SIZE + 8 * h.num_positions]
            for i, h in zip(live, live_headers, strict=True)
        ),
        "<u4",
    ).astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(positions)))[:-1]
    if len(live):
        totals = np.add.reduceat(lengths, starts) if lengths.size else np.zeros(0, np.int64)
        widest = np.maximum.reduceat(lengths, starts) if lengths.size else totals
    else:
        totals = widest = np.zeros(0, dtype=np.int64)
    supports = np.array([h.support_width for h in live_headers], dtype=np.int64)
    declared = np.array([h.frame_length for h in live_headers], dtype=np.int64)
    too_wide = widest > supports
    wrong_length = declared != MIN_FRAME_SIZE + 8 * positions + 8 * totals
    keep: list[int] = []
    for j, i in enumerate(live):
        header = live_headers[j]
        rid = header.request_id
        if too_wide[j]:
            mine = lengths[starts[j] : starts[j] + positions[j]]
            k = int(np.argmax(mine > header.support_width))
            errors[i] = HeaderFieldError(
                f"request {rid} position {k}: support size {int(mine[k])} exceeds "
                f"S = {header.support_width}",
                request_id=rid,
            )
        elif wrong_length[j]:
            errors[i] = FrameLengthError(
                f"request {rid}: declared length {header.frame_length}, but K = "
                f"{header.num_positions} with {int(totals[j])} support entries needs "
                f"{MIN_FRAME_SIZE + 8 * int(positions[j]) + 8 * int(totals[j])}",
                request_id=rid,
            )
        else:
            keep.append(j)

    # Contents of the frames that are structurally sound, flattened.
    kept_frames = [live[j] for j in keep]
    kept_headers = [live_headers[j] for j in keep]
    kept_pos = positions[keep] if keep else np.zeros(0, dtype=np.int64)
    kept_totals = totals[keep].tolist() if keep else []
    kept_mask = np.zeros(len(live), dtype=bool)
    kept_mask[keep] = True
    row_lengths = lengths[np.repeat(kept_mask, positions)]
    row_frame = np.repeat(np.arange(len(keep), dtype=np.int64), kept_pos)
    row_start = np.concatenate(([0], np.cumsum(kept_pos)))[:-1]
    row_position = np.arange(len(row_frame), dtype=np.int64) - np.repeat(row_start, kept_pos)
    drafts = _frombuffer_i32(
        b"".join(
            buffers[i][HEADER_SIZE : HEADER_SIZE + 4 * h.num_positions]
            for i, h in zip(kept_frames, kept_headers, strict=True)
        ),
        "<i4",
    )
    id_parts: list[bytes] = []
    count_parts: list[bytes] = []
    for i, h, total in zip(kept_frames, kept_headers, kept_totals, strict=True):
        base = HEADER_SIZE + 8 * h.num_positions
        id_parts.append(buffers[i][base : base + 4 * total])
        count_parts.append(buffers[i][base + 4 * total : base + 8 * total])
    ids = _frombuffer_i32(b"".join(id_parts), "<i4")
    counts = _frombuffer_i32(b"".join(count_parts), "<i4")
    entry_row = np.repeat(np.arange(len(row_frame), dtype=np.int64), row_lengths)
    row_offsets = np.concatenate(([0], np.cumsum(row_lengths)))
    entry_slot = np.arange(len(ids), dtype=np.int64) - row_offsets[:-1][entry_row]
    entry_frame = row_frame[entry_row]
    is_t0 = np.array([h.is_t0 for h in kept_headers], dtype=bool)
    denominators = np.array([h.denominator for h in kept_headers], dtype=np.int64)

    flat = _Flattened(ids, counts, drafts, row_offsets, row_frame, row_position, entry_row)
    frame_bad = np.zeros(len(keep), dtype=bool)
    for error_type, bad_entries, on_rows in _content_checks(flat, vocab_size, is_t0, denominators):
        owner = row_frame if on_rows else entry_frame
        hits = np.zeros(len(keep), dtype=bool)
        hits[owner[bad_entries]] = True
        new = hits & ~frame_bad
        for j in np.flatnonzero(new).tolist():
            index = int(np.flatnonzero(bad_entries & (owner == j))[0])
            errors[kept_frames[j]] = _describe(error_type, kept_headers[j], index, flat, vocab_size)
        frame_bad |= hits

    good = ~frame_bad
    good_rows = good[row_frame]
    good_entries = good[entry_frame]
    frame_index = np.array(kept_frames, dtype=np.int64)
    kept_row_frame = row_frame[good_rows]
    # Re-index rows after dropping bad frames, so entry_row points into the kept rows.
    new_row = np.cumsum(good_rows) - 1
    return DecodedFrames(
        headers=headers,
        errors=errors,
        drafts=drafts[good_rows],
        lengths=row_lengths[good_rows].astype(np.int32),
        row_frame=frame_index[kept_row_frame] if len(keep) else kept_row_frame,
        row_position=row_position[good_rows],
        ids=ids[good_entries],
        counts=counts[good_entries],
        entry_row=new_row[entry_row[good_entries]],
        entry_slot=entry_slot[good_entries],
    )


def _frombuffer_i32(data: bytes, dtype: str) -> npt.NDArray[Any]:
    return np.frombuffer(data, dtype=dtype) if data else np.zeros(0, dtype=dtype)


_Check = tuple[type[WireError], npt.NDArray[np.bool_], bool]


@dataclass(frozen=True)
class _Flattened:
    """The contents of the structurally sound frames, flattened across frames.

    Rows (one per position of a frame): ``drafts``, ``row_offsets`` (row r's support
    entries are ``[row_offsets[r], row_offsets[r + 1])``), ``row_frame`` (owning frame),
    ``row_position`` (k within the frame). Entries: ``ids``, ``counts``, ``entry_row``.
    """

    ids: npt.NDArray[Any]
    counts: npt.NDArray[Any]
    drafts: npt.NDArray[Any]
    row_offsets: npt.NDArray[np.int64]
    row_frame: npt.NDArray[np.int64]
    row_position: npt.NDArray[np.int64]
    entry_row: npt.NDArray[np.int64]


def _content_checks(
    flat: _Flattened,
    vocab_size: int,
    is_t0: npt.NDArray[np.bool_],
    denominators: npt.NDArray[np.int64],
) -> list[_Check]:
    """Per-entry / per-row violation masks, in the order a frame's first error is chosen."""
    ids, counts, drafts, entry_row = flat.ids, flat.counts, flat.drafts, flat.entry_row
    row_offsets, row_frame = flat.row_offsets, flat.row_frame
    ids64 = ids.astype(np.int64)
    out_of_range = (ids64 < 0) | (ids64 >= vocab_size)
    same_row = np.zeros(len(ids), dtype=bool)
    same_row[1:] = entry_row[1:] == entry_row[:-1]
    previous = np.zeros(len(ids), dtype=np.int64)
    previous[1:] = ids64[:-1]
    not_increasing = same_row & (ids64 <= previous)
    duplicate = np.zeros(len(ids), dtype=bool)
    if not_increasing.any():
        # Duplicates anywhere in a row (even when it is also unsorted): sort by (row, id).
        keyed = entry_row * (1 << 32) + (ids64 + (1 << 31))
        order = np.argsort(keyed, kind="stable")
        dup_sorted = np.zeros(len(ids), dtype=bool)
        dup_sorted[1:] = keyed[order][1:] == keyed[order][:-1]
        duplicate[order[dup_sorted]] = True
    unsorted = same_row & (ids64 < previous)
    nonpositive = counts <= 0
    draft_range = (drafts != NO_TOKEN) & ((drafts < 0) | (drafts >= vocab_size))
    running = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
    mass = running[row_offsets[1:]] - running[row_offsets[:-1]]
    denominator = denominators[row_frame]
    may_be_empty = (drafts == NO_TOKEN) | is_t0[row_frame]
    extra = mass > denominator
    missing = (mass < denominator) & ~((mass == 0) & may_be_empty)
    carries_q = (drafts != NO_TOKEN) & (mass == denominator) & ~is_t0[row_frame]
    hit = ids64 == drafts[entry_row]
    has_mass = np.bincount(entry_row[hit], minlength=len(drafts)) > 0
    zero_proposal = carries_q & ~has_mass
    return [
        (SupportIdRangeError, out_of_range, False),
        (DuplicateSupportError, duplicate, False),
        (UnsortedSupportError, unsorted, False),
        (NonPositiveCountError, nonpositive, False),
        (DraftIdRangeError, draft_range, True),
        (MissingMassError, missing, True),
        (ExtraMassError, extra, True),
        (ZeroCountProposalError, zero_proposal, True),
    ]


def _describe(
    error_type: type[WireError], header: FrameHeader, index: int, flat: _Flattened, vocab_size: int
) -> WireError:
    """The error for the first violation (entry or row ``index``) of one frame."""
    ids, counts, drafts, entry_row = flat.ids, flat.counts, flat.drafts, flat.entry_row
    row_offsets, row_position = flat.row_offsets, flat.row_position
    rid, denominator = header.request_id, header.denominator
    if error_type in (DraftIdRangeError, MissingMassError, ExtraMassError, ZeroCountProposalError):
        row = index
        where = f"request {rid} position {int(row_position[row])}"
        draft = int(drafts[row])
        mass = int(counts[row_offsets[row] : row_offsets[row + 1]].sum(dtype=np.int64))
        if error_type is DraftIdRangeError:
            message = f"{where}: proposal {draft} is neither -1 nor in [0, {vocab_size})"
        elif error_type is ZeroCountProposalError:
            message = (
                f"{where}: proposal {draft} has q count 0 (not in the support); a proposal "
                "must have been drawable from its q"
            )
        else:
            kind = "extra" if error_type is ExtraMassError else "missing"
            message = (
                f"{where}: counts sum to {mass}, expected the denominator {denominator} "
                f"({kind} mass; 0 is allowed only for a T0 frame or a proposal of -1)"
            )
        return error_type(message, request_id=rid)
    row = int(entry_row[index])
    where = f"request {rid} position {int(row_position[row])}"
    value = int(ids[index])
    if error_type is SupportIdRangeError:
        message = f"{where}: support id {value} outside [0, {vocab_size})"
    elif error_type is DuplicateSupportError:
        message = f"{where}: support id {value} listed more than once"
    elif error_type is UnsortedSupportError:
        message = (
            f"{where}: support id {value} after {int(ids[index - 1])}; ids must be strictly "
            "increasing"
        )
    else:
        message = (
            f"{where}: support id {value} has count {int(counts[index])}; listed entries "
            "must have count >= 1"
        )
    return error_type(message, request_id=rid)
