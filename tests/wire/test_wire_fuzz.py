"""Fuzzing the decoder with hypothesis: random bytes, sealed garbage, mutated valid frames.

Properties: decoding never raises anything but a WireError; a frame that passes has the
invariants of docs/wire.md; a mutated frame either is refused or decodes to exactly the
original content; batch decoding agrees with single-frame decoding frame by frame.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_wire import C, V, _batch, forge

from pp3cli.wire import frames as wire

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DRAFTS, IDS, COUNTS, TEMPERATURE = _batch(5)
FRAMES = wire.encode_frames(
    DRAFTS, IDS, COUNTS, denominator=C, temperature=TEMPERATURE,
    request_ids=np.arange(len(DRAFTS)), generation=1, sequence=3,
)  # fmt: skip


def _decode(buffer: bytes) -> wire.Frame | wire.WireError:
    try:
        return wire.decode_frame(buffer, vocab_size=V)
    except wire.WireError as err:
        return err


def _assert_invariants(frame: wire.Frame) -> None:
    header = frame.header
    listed = frame.q_counts > 0
    assert ((frame.q_ids >= 0) & (frame.q_ids < V))[listed].all()
    assert (frame.q_ids[~listed] == -1).all() and (frame.q_counts[~listed] == 0).all()
    mass = frame.q_counts.sum(axis=1, dtype=np.int64)
    for k, x in enumerate(frame.draft_tokens.tolist()):
        assert x == -1 or 0 <= x < V
        row = frame.q_ids[k][listed[k]]
        assert (np.diff(row) > 0).all()
        assert mass[k] == header.denominator or (mass[k] == 0 and (x == -1 or header.is_t0))
        if x >= 0 and not header.is_t0:
            assert x in row.tolist()


def _same(a: wire.Frame, b: wire.Frame) -> bool:
    return (
        a.header == b.header
        and np.array_equal(a.draft_tokens, b.draft_tokens)
        and np.array_equal(a.q_ids, b.q_ids)
        and np.array_equal(a.q_counts, b.q_counts)
    )


ORIGINALS = [wire.decode_frame(f, vocab_size=V) for f in FRAMES]


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes_never_crash(data: bytes) -> None:
    result = _decode(data)
    assert isinstance(result, wire.WireError)  # 2^-32 for a random CRC match: never here
    assert wire.decode_frames([data], vocab_size=V).errors[0] is not None


@FUZZ
@given(st.binary(max_size=200), st.integers(1, 3), st.integers(0, 6), st.booleans())
def test_sealed_garbage_is_refused_or_sound(payload: bytes, k: int, n: int, t0: bool) -> None:
    """A correct header and CRC around arbitrary content: refused, or it meets the law."""
    length = wire.MIN_FRAME_SIZE + len(payload)
    header = wire.HEADER.pack(
        wire.MAGIC, wire.VERSION, wire.FLAG_T0 if t0 else 0, 1, 1, 0, k, n or 1, C,
        0.0 if t0 else 1.0, length,
    )  # fmt: skip
    result = _decode(wire.seal(header + payload))
    if isinstance(result, wire.Frame):
        _assert_invariants(result)


mutation = st.one_of(
    st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)),
                                        min_size=1, max_size=3)),
    st.tuples(st.just("set"), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                       min_size=1, max_size=4)),
    st.tuples(st.just("cut"), st.integers(0, 10**6)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=12)),
    st.tuples(st.just("delete"), st.integers(0, 10**6)),
)  # fmt: skip


def _mutate(frame: bytes, op: tuple[str, Any]) -> bytes:
    kind, arg = op
    data = bytearray(frame)
    if kind == "flip":
        for position, bit in arg:
            data[position % len(data)] ^= 1 << bit
    elif kind == "set":
        for position, value in arg:
            data[position % len(data)] = value
    elif kind == "cut":
        del data[arg % len(data) :]
    elif kind == "append":
        data += arg
    else:
        del data[arg % len(data)]
    return bytes(data)


@FUZZ
@given(st.integers(0, len(FRAMES) - 1), mutation)
def test_mutated_frames_are_refused_or_unchanged(index: int, op: tuple[str, Any]) -> None:
    mutated = _mutate(FRAMES[index], op)
    result = _decode(mutated)
    if isinstance(result, wire.Frame):
        assert mutated == FRAMES[index]  # the only way through: nothing changed
        assert _same(result, ORIGINALS[index])


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(FRAMES) - 1), mutation | st.none()), max_size=6))
def test_batch_decoding_agrees_with_single_decoding(
    plan: list[tuple[int, tuple[str, Any] | None]],
) -> None:
    buffers = [FRAMES[i] if op is None else _mutate(FRAMES[i], op) for i, op in plan]
    batch = wire.decode_frames(buffers, vocab_size=V)
    for i, buffer in enumerate(buffers):
        single = _decode(buffer)
        if isinstance(single, wire.WireError):
            assert type(batch.errors[i]) is type(single)
        else:
            assert batch.errors[i] is None and _same(batch.frame(i), single)


small_row = st.lists(st.tuples(st.integers(-2, V + 1), st.integers(-1, C)), max_size=4)


@FUZZ
@given(
    st.lists(st.tuples(st.integers(-2, V + 1), small_row), min_size=1, max_size=3),
    st.booleans(),
)
def test_structured_frames_are_refused_or_sound(
    rows: list[tuple[int, list[tuple[int, int]]]], t0: bool
) -> None:
    """Near-valid content under a valid CRC: every accepted frame satisfies the law."""
    frame = forge([x for x, _ in rows], [r for _, r in rows], temperature=0.0 if t0 else 1.0)
    result = _decode(frame)
    if isinstance(result, wire.Frame):
        _assert_invariants(result)
        for k, (_, row) in enumerate(rows):  # and it is exactly what was sent
            listed = result.q_counts[k] > 0
            assert list(zip(result.q_ids[k][listed].tolist(), result.q_counts[k][listed].tolist(),
                            strict=True)) == row  # fmt: skip


def test_structured_generator_reaches_accepted_frames() -> None:
    assert isinstance(_decode(forge([3, -1], [[(3, C)], []])), wire.Frame)
