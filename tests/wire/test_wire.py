"""Frame format: round trip to selector tensors, and every fail-closed refusal of point 2."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from pp3cli.wire import frames as wire

V = 50
C = 16


I32 = npt.NDArray[np.int32]


def _batch(
    seed: int, batch: int = 6, positions: int = 3, support: int = 4
) -> tuple[I32, I32, I32, npt.NDArray[np.float32]]:
    """Mixed T0/T1 batch with shuffled (unsorted) q slots, padding and an invalidated draft."""
    rng = np.random.default_rng(seed)
    ids = np.full((batch, positions, support), -1, dtype=np.int32)
    counts = np.zeros((batch, positions, support), dtype=np.int32)
    drafts = np.zeros((batch, positions), dtype=np.int32)
    for b in range(batch):
        for k in range(positions):
            n = int(rng.integers(1, support + 1))
            chosen = rng.choice(V, n, replace=False)
            mass = rng.multinomial(C - n, np.ones(n) / n) + 1
            slots = rng.permutation(support)[:n]
            ids[b, k, slots] = chosen
            counts[b, k, slots] = mass
            drafts[b, k] = chosen[0]
    drafts[min(1, batch - 1), positions - 1] = -1
    temperature = np.where(np.arange(batch) % 2 == 0, 0.0, 0.7).astype(np.float32)
    return drafts, ids, counts, temperature


def _law(ids: npt.NDArray[np.int32], counts: npt.NDArray[np.int32]) -> list[dict[int, int]]:
    flat_ids, flat_counts = ids.reshape(-1, ids.shape[-1]), counts.reshape(-1, ids.shape[-1])
    return [
        {int(i): int(c) for i, c in zip(row_i, row_c, strict=True) if c != 0}
        for row_i, row_c in zip(flat_ids, flat_counts, strict=True)
    ]


def _encode(
    drafts: wire.ArrayLike,
    ids: wire.ArrayLike,
    counts: wire.ArrayLike,
    temperature: wire.ArrayLike,
    **kw: Any,
) -> list[bytes]:
    args: dict[str, Any] = {"request_ids": np.arange(len(drafts)), "generation": 2, "sequence": 5}
    args.update(kw)
    return wire.encode_frames(drafts, ids, counts, denominator=C, temperature=temperature, **args)


def forge(
    drafts: list[int],
    rows: list[list[tuple[int, int]]],
    *,
    temperature: float = 1.0,
    flags: int | None = None,
    denominator: int = C,
    support: int = 4,
    version: int = wire.VERSION,
    magic: bytes = wire.MAGIC,
    length_delta: int = 0,
) -> bytes:
    """A well-sealed frame with arbitrary content (valid CRC), for content refusals."""
    lengths = [len(r) for r in rows]
    ids = [i for r in rows for i, _ in r]
    counts = [c for r in rows for _, c in r]
    k, n = len(drafts), len(ids)
    length = wire.MIN_FRAME_SIZE + 8 * k + 8 * n + length_delta
    if flags is None:
        flags = wire.FLAG_T0 if temperature == 0.0 else 0
    header = wire.HEADER.pack(
        magic, version, flags, 7, 2, 5, k, support, denominator, temperature, length
    )
    body = header + struct.pack(f"<{k}i{k}I{n}i{n}i", *drafts, *lengths, *ids, *counts)
    return wire.seal(body)


def test_round_trip_is_the_same_law_sorted_and_padded() -> None:
    drafts, ids, counts, temperature = _batch(0)
    frames = _encode(drafts, ids, counts, temperature)
    decoded = wire.decode_frames(frames, vocab_size=V)
    assert decoded.errors == [None] * len(frames)
    out_d = np.empty_like(drafts)
    out_i = np.empty_like(ids)
    out_c = np.empty_like(counts)
    decoded.scatter(np.arange(len(frames))[::-1].copy(), out_d, out_i, out_c)
    out_d, out_i, out_c = out_d[::-1], out_i[::-1], out_c[::-1]
    np.testing.assert_array_equal(out_d, drafts)
    assert _law(out_i, out_c) == _law(ids, counts)
    listed = out_c > 0
    # Canonical layout: listed entries first, strictly increasing; then -1 / 0 padding.
    assert (np.diff(listed.astype(int), axis=-1) <= 0).all()
    assert (out_i[~listed] == -1).all() and (out_c[~listed] == 0).all()
    sorted_ids = np.where(listed, out_i, np.iinfo(np.int32).max)
    assert (np.diff(sorted_ids, axis=-1)[listed[..., 1:]] > 0).all()
    one = wire.decode_frame(frames[3], vocab_size=V)
    assert one.header.request_id == 3 and one.header.generation == 2
    assert one.header.sequence == 5 and one.header.temperature == pytest.approx(0.7)
    assert not one.header.is_t0 and wire.decode_frame(frames[0], vocab_size=V).header.is_t0


def test_torch_inputs_encode_like_numpy() -> None:
    drafts, ids, counts, temperature = _batch(1)
    from_numpy = _encode(drafts, ids, counts, temperature)
    from_torch = _encode(
        torch.from_numpy(drafts),
        torch.from_numpy(ids),
        torch.from_numpy(counts),
        torch.from_numpy(temperature),
        request_ids=torch.arange(len(drafts)),
    )
    assert from_numpy == from_torch


def test_layout_is_version_1_with_a_48_byte_header() -> None:
    frame = forge([3], [[(3, C)]])
    assert wire.HEADER_SIZE == 48 and frame[:4] == b"PP3Q"
    assert struct.unpack_from("<H", frame, 4)[0] == 1
    assert len(frame) == 48 + 8 + 8 + 4


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (forge([3], [[(3, C)]], magic=b"XXXX"), wire.BadMagicError),
        (forge([3], [[(3, C)]], version=2), wire.UnsupportedVersionError),
        (forge([3], [[(3, C)]])[:30], wire.TruncatedFrameError),
        (forge([3], [[(3, C)]])[:-1], wire.TruncatedFrameError),
        (forge([3], [[(3, C)]]) + b"\0", wire.FrameLengthError),
        (forge([3], [[(3, C)]], length_delta=8), wire.TruncatedFrameError),
        (forge([3], [[(3, C)]], flags=0x0002), wire.HeaderFieldError),
        (forge([3], [[(3, C)]], temperature=1.0, flags=wire.FLAG_T0), wire.HeaderFieldError),
        (forge([3], [[(3, 12)]], denominator=12), wire.HeaderFieldError),
        (forge([3], [[(3, C)]], temperature=float("nan")), wire.HeaderFieldError),
        (forge([3], [[(1, 4), (2, 4), (3, 4), (4, 2), (5, 2)]]), wire.HeaderFieldError),
        # Content, T1 rows.
        (forge([3], [[(3, C - 1)]]), wire.MissingMassError),
        (forge([3], [[(3, C), (4, 1)]]), wire.ExtraMassError),
        (forge([3], [[]]), wire.MissingMassError),
        (forge([3], [[(3, 8), (3, 8)]]), wire.DuplicateSupportError),
        (forge([3], [[(4, 8), (3, 8)]]), wire.UnsortedSupportError),
        (forge([3], [[(3, 8), (V, 8)]]), wire.SupportIdRangeError),
        (forge([3], [[(-1, 8), (3, 8)]]), wire.SupportIdRangeError),
        (forge([3], [[(3, C), (4, 0)]]), wire.NonPositiveCountError),
        (forge([3], [[(3, C + 1), (4, -1)]]), wire.NonPositiveCountError),
        (forge([5], [[(3, 8), (4, 8)]]), wire.ZeroCountProposalError),
        (forge([V], [[(3, C)]]), wire.DraftIdRangeError),
        (forge([-2], [[(3, C)]]), wire.DraftIdRangeError),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_each_violation_has_its_own_error(frame: bytes, error: type[wire.WireError]) -> None:
    with pytest.raises(error) as info:
        wire.decode_frame(frame, vocab_size=V)
    assert type(info.value) is error
    assert info.value.reason == error.reason
    assert str(info.value)


@pytest.mark.parametrize(
    ("drafts", "rows", "temperature", "error"),
    [
        # Rows whose q carries no mass are still checked: T0 rows ...
        ([3], [[(7, 0), (7, 0)]], 0.0, wire.DuplicateSupportError),
        ([3], [[(9, 0), (7, 0)]], 0.0, wire.UnsortedSupportError),
        ([3], [[(V + 3, 0)]], 0.0, wire.SupportIdRangeError),
        ([3], [[(7, 0)]], 0.0, wire.NonPositiveCountError),
        ([3], [[(3, 5)]], 0.0, wire.MissingMassError),
        # ... and invalidated proposals.
        ([-1], [[(7, 0), (7, 0)]], 1.0, wire.DuplicateSupportError),
        ([-1], [[(9, 0), (7, 0)]], 1.0, wire.UnsortedSupportError),
        ([-1], [[(-5, 0)]], 1.0, wire.SupportIdRangeError),
        ([-1], [[(3, C), (4, 1)]], 1.0, wire.ExtraMassError),
    ],
)
def test_zero_mass_rows_are_checked_too(
    drafts: list[int],
    rows: list[list[tuple[int, int]]],
    temperature: float,
    error: type[wire.WireError],
) -> None:
    with pytest.raises(error):
        wire.decode_frame(forge(drafts, rows, temperature=temperature), vocab_size=V)


def test_rows_without_mass_are_allowed_where_the_contract_allows() -> None:
    t0 = wire.decode_frame(forge([3, 4], [[], []], temperature=0.0), vocab_size=V)
    assert (t0.q_ids == -1).all() and (t0.q_counts == 0).all()
    invalidated = wire.decode_frame(forge([3, -1], [[(3, C)], []]), vocab_size=V)
    assert invalidated.draft_tokens.tolist() == [3, -1]
    # A T0 proposal need not be in its q (T0 never reads q), as in the selector contract.
    assert wire.decode_frame(forge([5], [[(3, C)]], temperature=0.0), vocab_size=V)


def test_crc_catches_a_flipped_bit_anywhere() -> None:
    drafts, ids, counts, temperature = _batch(2, batch=1)
    frame = _encode(drafts, ids, counts, temperature)[0]
    for position in range(len(frame)):
        damaged = bytearray(frame)
        damaged[position] ^= 1 << (position % 8)
        with pytest.raises(wire.WireError) as info:
            wire.decode_frame(bytes(damaged), vocab_size=V)
        # Header fields checked before the CRC may answer first; never a valid frame.
        assert info.value.reason in {"crc_mismatch", "bad_magic", "bad_version", "truncated",
                                     "bad_length"}  # fmt: skip


def test_crc_error_does_not_trust_the_claimed_request_id() -> None:
    frame = bytearray(forge([3], [[(3, C)]]))
    frame[wire.HEADER_SIZE] ^= 1
    with pytest.raises(wire.CrcMismatchError) as info:
        wire.decode_frame(bytes(frame), vocab_size=V)
    assert info.value.request_id is None and "claimed request 7" in str(info.value)


def test_one_bad_frame_does_not_touch_the_others() -> None:
    drafts, ids, counts, temperature = _batch(3)
    frames = _encode(drafts, ids, counts, temperature)
    clean = wire.decode_frames(frames, vocab_size=V)
    mixed = list(frames)
    mixed[2] = forge([3], [[(3, 8), (3, 8)]])
    mixed.insert(4, b"garbage")
    decoded = wire.decode_frames(mixed, vocab_size=V)
    assert isinstance(decoded.errors[2], wire.DuplicateSupportError)
    assert isinstance(decoded.errors[4], wire.TruncatedFrameError)
    for original, now in ((0, 0), (1, 1), (3, 3), (4, 5), (5, 6)):
        assert decoded.errors[now] is None
        a, b = clean.frame(original), decoded.frame(now)
        np.testing.assert_array_equal(a.q_ids, b.q_ids)
        np.testing.assert_array_equal(a.q_counts, b.q_counts)
        np.testing.assert_array_equal(a.draft_tokens, b.draft_tokens)


def test_hostile_shape_is_refused_before_allocation() -> None:
    frame = forge([3] * 4, [[], [], [], []], temperature=0.0, support=60000)
    with pytest.raises(wire.HeaderFieldError, match="K <= 2, S <= 8"):
        wire.decode_frame(frame, vocab_size=V, max_positions=2, max_support=8)


def test_encoder_refuses_bad_shapes_and_denominators() -> None:
    drafts, ids, counts, temperature = _batch(4)
    with pytest.raises(ValueError, match="expected \\[B, K, S\\]"):
        _encode(drafts, ids[:, :2], counts[:, :2], temperature)
    with pytest.raises(wire.HeaderFieldError, match="power of two"):
        wire.encode_frames(
            drafts, ids, counts, denominator=24, temperature=temperature,
            request_ids=0, generation=0, sequence=0,
        )  # fmt: skip
