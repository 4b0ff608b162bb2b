"""Draft frames at their limits (pp3cli.wire.frames): the header's ranges on both sides,
the receiver's bounds, the structure checks, each refusal's message, and scattering."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from test_wire import C, V, forge

from pp3cli.wire import frames as wire


def _sealed(k: int, s: int, drafts: list[int], lengths: list[int], ids: list[int],
            counts: list[int], *, length: int) -> bytes:  # fmt: skip
    """A T1 frame whose header claims K = k, S = s and ``length``, carrying exactly the
    sections given, however few (valid CRC)."""
    header = wire.HEADER.pack(wire.MAGIC, wire.VERSION, 0, 7, 2, 5, k, s, C, 1.0, length)
    body = struct.pack(f"<{len(drafts)}i{len(lengths)}I", *drafts, *lengths)
    body += struct.pack(f"<{len(ids)}i{len(counts)}i", *ids, *counts)
    return wire.seal(header + body)


def test_the_t0_flag_is_bit_0_of_the_flags_field() -> None:
    assert struct.unpack_from("<H", forge([3], [[(3, C)]], temperature=0.0), 6)[0] == 1
    assert struct.unpack_from("<H", forge([3], [[(3, C)]], temperature=0.5), 6)[0] == 0
    encoded = wire.encode_frames(
        np.array([[1], [1]]),
        np.array([[[1]], [[1]]]),
        np.array([[[C]], [[C]]]),
        denominator=C,
        temperature=np.array([0.0, 1.0]),
        request_ids=0,
        generation=0,
        sequence=0,
    )
    assert [struct.unpack_from("<H", frame, 6)[0] for frame in encoded] == [1, 0]


@pytest.mark.parametrize(
    ("frame", "fragment"),
    [
        (forge([3], [[(3, 8), (V, 8)]]), f"request 7 position 0: support id {V} outside [0, {V})"),
        (forge([3], [[(3, 8), (3, 8)]]), "position 0: support id 3 listed more than once"),
        (forge([3], [[(4, 8), (3, 8)]]), "position 0: support id 3 after 4; ids must be strictly"),
        (forge([3], [[(3, C), (4, 0)]]), "position 0: support id 4 has count 0"),
        (forge([V], [[(3, C)]]), f"position 0: proposal {V} is neither -1 nor in [0, {V})"),
        (forge([5], [[(3, 8), (4, 8)]]), "position 0: proposal 5 has q count 0"),
        (forge([3], [[(3, C - 1)]]), f"counts sum to {C - 1}, expected the denominator {C} "
         "(missing mass"),
        (forge([3], [[(3, C), (4, 1)]]), f"counts sum to {C + 1}, expected the denominator {C} "
         "(extra mass"),
        (forge([3, 4], [[(3, C)], [(4, C - 2), (6, 1)]]), f"request 7 position 1: counts sum to "
         f"{C - 1}"),
        (forge([3, 4], [[(3, C)], [(4, C), (2, 3)]]), "position 1: support id 2 after 4"),
        (forge([3], [[(3, C)]], temperature=1.0, flags=wire.FLAG_T0), "T0 flag True with "
         "temperature 1.0"),
        (forge([3], [[(3, C)]], temperature=0.0, flags=0), "T0 flag False with temperature 0.0"),
        (forge([], [], support=1), "K = 0, S = 1: both must be >= 1"),
        (forge([3], [[(3, C)]], support=0), "K = 1, S = 0: both must be >= 1"),
        (forge([3, 4], [[(1, 4), (2, 4), (3, 4), (4, 4)], [(1, 4), (2, 4), (3, 4), (4, 2),
                                                        (5, 2)]]),
         "request 7 position 1: support size 5 exceeds S = 4"),
    ],
)  # fmt: skip
def test_each_refusal_names_where_and_the_value(frame: bytes, fragment: str) -> None:
    with pytest.raises(wire.WireError, match=re.escape(fragment)):
        wire.decode_frame(frame, vocab_size=V)


def test_a_declared_length_short_of_the_proposals_is_refused_before_reading_them() -> None:
    length = wire.MIN_FRAME_SIZE + 8  # room for one proposal and its n_k, not three
    short = _sealed(3, 1, [3], [1], [], [], length=length)
    assert len(short) == length
    with pytest.raises(wire.FrameLengthError, match="declared length 60 < 76 needed for K = 3"):
        wire.decode_frame(short, vocab_size=V)


def test_a_declared_length_that_disagrees_with_the_support_sizes_is_refused() -> None:
    # two entries claimed by n_0, one carried
    frame = _sealed(1, 4, [3], [2], [3], [C], length=wire.MIN_FRAME_SIZE + 8 + 8)
    with pytest.raises(wire.FrameLengthError, match="with 2 support entries needs 76$"):
        wire.decode_frame(frame, vocab_size=V)


def test_ids_need_only_increase_within_a_position() -> None:
    """Id 0 first, and a position whose ids start below the previous position's last."""
    frame = forge([0, 1], [[(0, 8), (9, 8)], [(1, C)]])
    decoded = wire.decode_frame(frame, vocab_size=V)
    assert decoded.q_ids.tolist() == [[0, 9, -1, -1], [1, -1, -1, -1]]
    assert decoded.draft_tokens.tolist() == [0, 1]


def test_a_one_token_vocabulary_and_the_smallest_frame() -> None:
    frame = forge([0], [[(0, C)]], support=1)
    assert wire.decode_frame(frame, vocab_size=1).q_counts.tolist() == [[C]]
    with pytest.raises(ValueError, match="vocab_size 0: expected >= 1"):
        wire.decode_frame(frame, vocab_size=0)


def test_the_receivers_bounds_on_k_and_s() -> None:
    """K <= 64 by default; K = max_positions and S = max_support are accepted, one more of
    either alone is refused."""
    wide = forge([3] * 64, [[(3, C)]] * 64, support=2)
    assert wire.decode_frame(wide, vocab_size=V).draft_tokens.shape == (64,)
    over = forge([3] * 65, [[(3, C)]] * 65, support=2)
    with pytest.raises(wire.HeaderFieldError, match="accepts K <= 64"):
        wire.decode_frame(over, vocab_size=V)
    assert isinstance(wire.decode_frames([over], vocab_size=V).errors[0], wire.HeaderFieldError)
    frame = forge([3, 4], [[(3, C)], [(4, C)]], support=3)
    wire.decode_frame(frame, vocab_size=V, max_positions=2, max_support=3)
    for bounds in ({"max_positions": 1, "max_support": 3}, {"max_positions": 2, "max_support": 2}):
        with pytest.raises(wire.HeaderFieldError, match="this receiver accepts"):
            wire.decode_frame(frame, vocab_size=V, **bounds)


def _encode(k: int, s: int, **fields: int) -> list[bytes]:
    ids = np.full((1, k, s), -1)
    counts = np.zeros((1, k, s), dtype=np.int64)
    if k and s:
        ids[:, :, 0], counts[:, :, 0] = 3, C
    header = {"request_ids": 0, "generation": 0, "sequence": 0} | fields
    return wire.encode_frames(
        np.full((1, k), 3), ids, counts, denominator=C, temperature=np.ones(1), **header
    )


def test_the_encoder_fills_each_header_field_to_its_range() -> None:
    top = (1 << 64) - 1
    (frame,) = _encode(1, 1, request_ids=top, generation=top, sequence=top)
    header = wire.decode_frame(frame, vocab_size=V).header
    assert (header.request_id, header.generation, header.sequence) == (top, top, top)
    for name in ("request_ids", "generation", "sequence"):
        with pytest.raises(ValueError, match=f"{name}: -1 does not fit an unsigned 64-bit"):
            _encode(1, 1, **{name: -1})
    assert len(_encode(1, 0xFFFF)[0]) == wire.MIN_FRAME_SIZE + 8 + 8
    assert len(_encode(0xFFFF, 1)[0]) == wire.MIN_FRAME_SIZE + 0xFFFF * 16
    for k, s in ((0, 1), (1, 0), (0x10000, 1), (1, 0x10000)):
        with pytest.raises(ValueError, match=f"K = {k}, S = {s}: each must be in"):
            _encode(k, s)


def test_decoding_nothing_or_only_bad_frames_gives_errors_and_no_rows() -> None:
    empty = wire.decode_frames([], vocab_size=V)
    assert empty.errors == [] and empty.drafts.size == 0 and empty.ids.size == 0
    bad = wire.decode_frames([b"junk", forge([3], [[(3, C)]], magic=b"XXXX")], vocab_size=V)
    assert [type(e) for e in bad.errors] == [wire.TruncatedFrameError, wire.BadMagicError]
    assert bad.drafts.size == 0 and bad.ids.size == 0


def test_scatter_refuses_frames_it_cannot_write() -> None:
    good = forge([3, 4], [[(3, C)], [(4, C)]])
    content_error = forge([3, 4], [[(3, C)], [(4, C - 1)]])
    decoded = wire.decode_frames([good, content_error], vocab_size=V)
    assert decoded.errors[0] is None and decoded.errors[1] is not None

    def out(k: int = 2, s: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        shape = (2, k, s)
        return (np.zeros((2, k), np.int32), np.zeros(shape, np.int32), np.zeros(shape, np.int32))

    with pytest.raises(ValueError, match="frame 1 failed validation"):
        decoded.scatter(np.array([1, 0]), *out())
    drafts, ids, counts = out()
    decoded.scatter(np.array([0, -1]), drafts, ids, counts)
    assert drafts[0].tolist() == [3, 4] and counts[0, :, 0].tolist() == [C, C]
    for k, s in ((3, 4), (2, 3)):
        with pytest.raises(ValueError, match="does not fit a batch with"):
            decoded.scatter(np.array([0, -1]), *out(k, s))
    drafts, ids, counts = out()
    with pytest.raises(ValueError, match="C-contiguous"):
        decoded.scatter(np.array([0, -1]), drafts, ids, np.asfortranarray(counts))


@pytest.mark.parametrize("name", ["request_ids", "generation", "sequence"])
def test_a_header_integer_past_64_bits_is_named_with_its_value(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}: {1 << 64} does not fit an unsigned 64-bit"):
        _encode(1, 1, **{name: 1 << 64})
