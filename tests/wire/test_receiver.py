"""Receiver: per-request state, K = 0 fallback, refusals that never leak into other rows."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest
from test_wire import I32, C, V, _batch, _law

from pp3cli.wire import frames as wire
from pp3cli.wire import receiver as rx

K, S = 3, 4


F32 = npt.NDArray[np.float32]
Setup = tuple[rx.DraftReceiver, list[int], I32, I32, I32, F32]
Mutation = Callable[[rx.DraftReceiver, list[int], I32, I32, I32, F32, bytes], bytes | None]


def _setup(seed: int = 0, batch: int = 6) -> Setup:
    drafts, ids, counts, temperature = _batch(seed, batch=batch, positions=K, support=S)
    recv = rx.DraftReceiver(
        slot="slot-a", vocab_size=V, num_positions=K, support_width=S, denominator=C
    )
    request_ids = [100 + b for b in range(batch)]
    for rid, temp in zip(request_ids, temperature.tolist(), strict=True):
        recv.admit(rid, temperature=temp, generation=2)
    return recv, request_ids, drafts, ids, counts, temperature


def _frames(
    drafts: I32,
    ids: I32,
    counts: I32,
    temperature: F32,
    request_ids: Sequence[int],
    *,
    generation: int = 2,
    sequence: int = 0,
) -> list[bytes]:
    return wire.encode_frames(
        drafts, ids, counts, denominator=C, temperature=temperature,
        request_ids=np.array(request_ids, dtype=np.uint64), generation=generation,
        sequence=sequence,
    )  # fmt: skip


def _assert_fallback_row(inputs: rx.RoundInputs, b: int) -> None:
    assert inputs.fallback[b]
    assert (inputs.draft_tokens[b] == -1).all()
    assert (inputs.q_ids[b] == -1).all() and (inputs.q_counts[b] == 0).all()


def _assert_intact(inputs: rx.RoundInputs, b: int, drafts: I32, ids: I32, counts: I32) -> None:
    assert not inputs.fallback[b]
    np.testing.assert_array_equal(inputs.draft_tokens[b], drafts[b])
    assert _law(inputs.q_ids[b], inputs.q_counts[b]) == _law(ids[b], counts[b])


def test_all_valid_frames_reach_the_selector_inputs() -> None:
    recv, rids, drafts, ids, counts, temperature = _setup()
    frames = _frames(drafts, ids, counts, temperature, rids)[::-1]  # arrival order is free
    inputs = recv.receive_round(rids, frames)
    for b in range(len(rids)):
        _assert_intact(inputs, b, drafts, ids, counts)
    np.testing.assert_array_equal(inputs.temperature, temperature)
    assert inputs.refusals == [] and recv.stats.frames_accepted == len(rids)
    assert inputs.q_ids.dtype == np.int32 and inputs.draft_tokens.shape == (len(rids), K)
    import torch

    logits = torch.zeros((len(rids), K + 1, V))
    chain = inputs.chain_inputs(logits, torch.arange(len(rids)), torch.zeros(len(rids)))
    assert chain.q_ids is not None and chain.q_ids.shape == (len(rids), K, S)
    assert chain.temperature.dtype == torch.float32 and chain.denominator == C
    assert chain.logits is logits
    assert recv.state(rids[0]).next_sequence == 1


def _run_with(
    replacement_for_row_2: Mutation, *, extra: Sequence[bytes] = ()
) -> tuple[rx.RoundInputs, rx.Refusal, rx.DraftReceiver]:
    recv, rids, drafts, ids, counts, temperature = _setup()
    sent = _frames(drafts, ids, counts, temperature, rids)
    frames: list[bytes | None] = list(sent)  # the mutation may drop row 2's frame (None)
    frames[2] = replacement_for_row_2(recv, rids, drafts, ids, counts, temperature, sent[2])
    inputs = recv.receive_round(rids, [f for f in frames if f is not None] + list(extra))
    _assert_fallback_row(inputs, 2)
    for b in (0, 1, 3, 4, 5):
        _assert_intact(inputs, b, drafts, ids, counts)
    fallback = [r for r in inputs.refusals if r.fallback]
    assert [(r.request_id, r.fallback) for r in fallback] == [(rids[2], True)]
    return inputs, fallback[0], recv


def _reencode(
    b: int, drafts: I32, ids: I32, counts: I32, temperature: F32, rids: list[int], **kw: Any
) -> bytes:
    return _frames(drafts[b : b + 1], ids[b : b + 1], counts[b : b + 1],
                   temperature[b : b + 1], [rids[b]], **kw)[0]  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda r, rids, d, i, c, t, f: None, "missing"),
        (lambda r, rids, d, i, c, t, f: f[:-3], "missing"),  # truncated: id untrusted
        (lambda r, rids, d, i, c, t, f: f[:60] + bytes([f[60] ^ 1]) + f[61:], "missing"),
        (lambda r, rids, d, i, c, t, f: _reencode(2, d, i, c, t, rids, generation=1),
         "stale_generation"),
        (lambda r, rids, d, i, c, t, f: _reencode(2, d, i, c, t, rids, generation=3),
         "future_generation"),
        (lambda r, rids, d, i, c, t, f: _reencode(2, d, i, c, t, rids, sequence=1),
         "sequence_gap"),
        (lambda r, rids, d, i, c, t, f: _reencode(2, d, i, c, t[::-1].copy(), rids),
         "temperature_mismatch"),
    ],
)  # fmt: skip
def test_a_refused_frame_falls_back_alone(mutate: Mutation, reason: str) -> None:
    inputs, fallback, recv = _run_with(mutate)
    assert fallback.reason == reason
    assert recv.stats.fallback_by_reason[reason] == 1 and recv.stats.fallbacks == 1


def test_content_errors_name_the_request_and_fall_back() -> None:
    recv, rids, drafts, ids, counts, temperature = _setup()
    counts = counts.copy()
    listed = np.argwhere(counts[2, 0] > 0)[0][0]
    counts[2, 0, listed] -= 1
    frames = _frames(drafts, ids, counts, temperature, rids)
    inputs = recv.receive_round(rids, frames)
    _assert_fallback_row(inputs, 2)
    refused = [r for r in inputs.refusals if not r.fallback]
    assert [(r.request_id, r.reason) for r in refused] == [(rids[2], "missing_mass")]
    assert [r.reason for r in inputs.refusals if r.fallback] == ["missing_mass"]


def test_not_owned_unscheduled_and_shape_frames_are_refused() -> None:
    recv, rids, drafts, ids, counts, temperature = _setup()
    recv.admit(999, temperature=1.0, generation=2)
    frames = _frames(drafts, ids, counts, temperature, rids)
    foreign = _frames(drafts[:1], ids[:1], counts[:1], temperature[:1], [4242])[0]
    unscheduled = _frames(drafts[1:2], ids[1:2], counts[1:2], temperature[1:2], [999])[0]
    wide = np.full((1, K, S + 1), -1, np.int32)
    wide_counts = np.zeros((1, K, S + 1), np.int32)
    wide[..., :S], wide_counts[..., :S] = ids[3:4], counts[3:4]
    wrong_shape = wire.encode_frames(
        drafts[3:4], wide, wide_counts, denominator=C, temperature=temperature[3:4],
        request_ids=rids[3], generation=2, sequence=0,
    )[0]  # fmt: skip
    frames[3] = wrong_shape  # S too wide: refused by the decoder's bound
    frames[5] = wire.encode_frames(
        drafts[5:6], ids[5:6], 2 * counts[5:6], denominator=2 * C,
        temperature=temperature[5:6], request_ids=rids[5], generation=2, sequence=0,
    )[0]  # fmt: skip
    inputs = recv.receive_round(rids, frames + [foreign, unscheduled])
    reasons = {(r.request_id, r.reason) for r in inputs.refusals if not r.fallback}
    assert reasons == {
        (4242, "not_owned"),
        (999, "not_scheduled"),
        (rids[3], "bad_header"),
        (rids[5], "shape"),
    }
    assert inputs.fallback.tolist() == [False, False, False, True, False, True]


def test_two_valid_frames_for_one_request_are_both_refused() -> None:
    recv, rids, drafts, ids, counts, temperature = _setup()
    frames = _frames(drafts, ids, counts, temperature, rids)
    # Another request's proposals relabelled as request 2: CRC and sequence are valid.
    imposter = _frames(drafts[4:5], ids[4:5], counts[4:5], temperature[2:3], [rids[2]])[0]
    inputs = recv.receive_round(rids, frames + [imposter])
    _assert_fallback_row(inputs, 2)
    dup = [r for r in inputs.refusals if r.reason == "duplicate_frame" and not r.fallback]
    assert len(dup) == 2


def test_late_frame_is_stale_next_round_and_the_round_continues() -> None:
    recv, rids, drafts, ids, counts, temperature = _setup()
    round0 = _frames(drafts, ids, counts, temperature, rids, sequence=0)
    first = recv.receive_round(rids, [f for b, f in enumerate(round0) if b != 1])
    _assert_fallback_row(first, 1)
    round1 = _frames(drafts, ids, counts, temperature, rids, sequence=1)
    second = recv.receive_round(rids, round1 + [round0[1], round0[0]])  # late + replay
    assert not second.fallback.any()
    # A stale_sequence refusal is decided after the frame's id is trusted: never None.
    stale = sorted(cast(int, r.request_id) for r in second.refusals if r.reason == "stale_sequence")
    assert stale == [rids[0], rids[1]]


def test_new_generation_makes_old_frames_stale() -> None:
    recv, rids, drafts, ids, counts, temperature = _setup()
    assert recv.new_generation(rids[0]) == 3
    frames = _frames(drafts, ids, counts, temperature, rids)
    inputs = recv.receive_round(rids, frames)
    assert inputs.fallback.tolist() == [True] + [False] * 5
    assert inputs.refusals[0].reason == "stale_generation"


def test_every_refusal_is_logged_with_request_and_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recv, rids, drafts, ids, counts, temperature = _setup()
    frames = _frames(drafts, ids, counts, temperature, rids)
    frames[4] = _reencode(4, drafts, ids, counts, temperature, rids, generation=0)
    with caplog.at_level(logging.WARNING, logger="pp3cli.wire.receiver"):
        recv.receive_round(rids, frames[:5])  # request 105 sends nothing
    text = caplog.text
    assert f"request {rids[4]} (stale_generation)" in text
    assert f"request {rids[4]} falls back" in text
    assert f"request {rids[5]} falls back to target-only verification (missing)" in text
    assert len(recv.refusals) == 3


def test_caller_errors_raise() -> None:
    recv, rids, *_ = _setup()
    with pytest.raises(ValueError, match="not owned"):
        recv.receive_round([12345], [])
    with pytest.raises(ValueError, match="twice"):
        recv.receive_round([rids[0], rids[0]], [])
    with pytest.raises(ValueError, match="already owned"):
        recv.admit(rids[0], temperature=1.0)
    recv.release(rids[0])
    assert not recv.owns(rids[0])


def test_stats_count_each_round_and_reason() -> None:
    """A stale frame falls back under its reason; a frame whose CRC fails names no request
    it could be trusted for, so its request counts as missing, like one that sent nothing."""
    recv, rids, drafts, ids, counts, temperature = _setup()
    frames = _frames(drafts, ids, counts, temperature, rids)
    frames[1] = _reencode(1, drafts, ids, counts, temperature, rids, generation=0)
    frames[3] = frames[3][:-1] + bytes([frames[3][-1] ^ 1])
    first = recv.receive_round(rids, frames[:5])  # the last request sends nothing
    assert first.fallback.tolist() == [False, True, False, True, False, True]
    fallbacks = {r.request_id: r.message for r in first.refusals if r.fallback}
    assert fallbacks[rids[1]] == f"request {rids[1]}: its frame was refused (stale_generation)"
    assert fallbacks[rids[3]] == fallbacks[rids[5]].replace(str(rids[5]), str(rids[3]))
    assert fallbacks[rids[5]] == f"request {rids[5]}: no frame arrived in round 0"
    second = recv.receive_round(rids, _frames(drafts, ids, counts, temperature, rids, sequence=1))
    assert not second.fallback.any()
    assert recv.stats.to_json() == {
        "rounds": 2,
        "frames_received": 5 + 6,
        "frames_accepted": 3 + 6,
        "frames_refused": 2,
        "requests_verified": 3 + 6,
        "fallbacks": 3,
        "refused_by_reason": {"stale_generation": 1, "crc_mismatch": 1},
        "fallback_by_reason": {"stale_generation": 1, "missing": 2},
    }
    assert type(recv.stats.to_json()["refused_by_reason"]) is dict


@pytest.mark.parametrize(
    ("vocab", "k", "s", "c", "fragment"),
    [
        (0, K, S, C, "vocab_size 0"),
        (V, 0, S, C, "K 0"),
        (V, K, 0, C, "S 0"),
        (V, K, S, 0, "denominator 0"),
        (V, K, S, 12, "denominator 12"),
        (V, K, S, 1 << 25, "denominator 33554432"),
    ],
)
def test_a_receiver_of_impossible_shape_is_refused(
    vocab: int, k: int, s: int, c: int, fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment):
        rx.DraftReceiver(
            slot="s", vocab_size=vocab, num_positions=k, support_width=s, denominator=c
        )


@pytest.mark.parametrize("c", [1, 1 << 24])
def test_the_smallest_receiver_and_the_denominators_range(c: int) -> None:
    recv = rx.DraftReceiver(slot="s", vocab_size=1, num_positions=1, support_width=1, denominator=c)
    recv.admit(0, temperature=0.0)
    assert recv.owns(0)


@pytest.mark.parametrize("temperature", [-1.0, float("nan"), float("inf")])
def test_a_request_needs_a_finite_temperature_at_least_0(temperature: float) -> None:
    recv, *_ = _setup()
    with pytest.raises(ValueError, match=f"temperature {temperature} must be >= 0"):
        recv.admit(7, temperature=temperature)
    assert not recv.owns(7)


def test_a_request_starts_at_generation_0_and_each_generation_at_sequence_0() -> None:
    _, _, drafts, ids, counts, temperature = _setup(batch=1)
    recv = rx.DraftReceiver(slot="s", vocab_size=V, num_positions=K, support_width=S, denominator=C)
    recv.admit(9, temperature=float(temperature[0]))
    first = recv.receive_round([9], _frames(drafts, ids, counts, temperature, [9], generation=0))
    assert not first.fallback.any()
    assert recv.new_generation(9) == 1
    again = recv.receive_round([9], _frames(drafts, ids, counts, temperature, [9], generation=1))
    assert not again.fallback.any() and again.refusals == []
