"""The real proxy: a drafter in a spawned OS process (and a thread), frames over a socketpair.

Each scenario ends with the right requests falling back (K = 0 rows), every other request
verified with its drafts intact, and nothing lost: every scheduled request of every round
is either intact or listed as a fallback with its reason.
"""

from __future__ import annotations

import dataclasses
import inspect
import multiprocessing
import re
import time
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pytest
import torch
from test_wire import I32, C, V, _batch, _law

from pp3cli.run.scratch import repo_root
from pp3cli.wire import proxy
from pp3cli.wire.frames import MIN_FRAME_SIZE, encode_frames, seal
from pp3cli.wire.receiver import DraftReceiver, Refusal, RoundInputs

if TYPE_CHECKING:
    from pp3kernels import ChainVerifier

K, S, B, ROUNDS = 3, 4, 8, 3
GENERATION = 4
TIMEOUT_S = 30.0  # bound per round; a healthy round ends at its end marker in milliseconds

reference_verify_chain: ChainVerifier | None
try:
    from pp3kernels import reference_verify_chain as _reference_verify_chain

    reference_verify_chain = _reference_verify_chain
except ImportError:  # the verifier is written in parallel; check the receiver's output only
    reference_verify_chain = None

RoundData = tuple[I32, I32, I32, npt.NDArray[np.float32]]


def _round_data(round_index: int) -> RoundData:
    drafts, ids, counts, temperature = _batch(10 + round_index, batch=B, positions=K, support=S)
    return drafts, ids, counts, temperature


def _temperature() -> npt.NDArray[np.float32]:
    return _round_data(0)[3]


def _run(
    mode: proxy.Mode, faults: tuple[proxy.Fault, ...]
) -> tuple[list[tuple[RoundInputs, RoundData]], proxy.ProxyStats, list[int]]:
    """Three rounds of B requests through a real drafter; returns per-round inputs + data."""
    receiver = DraftReceiver(
        slot="verifier-0", vocab_size=V, num_positions=K, support_width=S, denominator=C
    )
    rids = [200 + b for b in range(B)]
    for rid, temp in zip(rids, _temperature().tolist(), strict=True):
        receiver.admit(rid, temperature=temp, generation=GENERATION)
    results: list[tuple[RoundInputs, RoundData]] = []
    with proxy.DraftProxy(mode=mode, faults=faults, round_timeout_s=TIMEOUT_S) as draft_proxy:
        for r in range(ROUNDS):
            drafts, ids, counts, _ = data = _round_data(r)
            job = proxy.DraftJob(
                round_index=r, request_ids=rids, generations=[GENERATION] * B,
                draft_tokens=drafts, q_ids=ids, q_counts=counts,
                temperature=_temperature(), denominator=C,
            )  # fmt: skip
            results.append((draft_proxy.run_round(receiver, job), data))
    return results, draft_proxy.stats, rids


def _check(
    results: list[tuple[RoundInputs, RoundData]],
    rids: list[int],
    expected_fallback: dict[int, set[int]],
    reasons: dict[tuple[int, int], str],
) -> None:
    """Fallback rows exactly as expected (with reasons), every other row intact."""
    for r, (inputs, (drafts, ids, counts, _)) in enumerate(results):
        want = expected_fallback.get(r, set())
        assert set(np.flatnonzero(inputs.fallback).tolist()) == want, f"round {r}"
        fallbacks = {x.request_id: x.reason for x in inputs.refusals if x.fallback}
        assert set(fallbacks) == {rids[b] for b in want}, f"round {r}: nothing lost"
        for b in want:
            assert (inputs.draft_tokens[b] == -1).all() and (inputs.q_counts[b] == 0).all()
            assert fallbacks[rids[b]] == reasons.get((r, b), "missing")
        for b in set(range(B)) - want:
            np.testing.assert_array_equal(inputs.draft_tokens[b], drafts[b])
            assert _law(inputs.q_ids[b], inputs.q_counts[b]) == _law(ids[b], counts[b])
        _verify(inputs, drafts, ids, counts, want, r)


def _verify(
    inputs: RoundInputs, drafts: I32, ids: I32, counts: I32, fallback: set[int], r: int
) -> None:
    """With the reference verifier: fallback rows emit one token (K = 0), others unchanged."""
    if reference_verify_chain is None:
        return
    gen = torch.Generator().manual_seed(1000 + r)
    logits = torch.randn(B, K + 1, V, generator=gen)
    seed = torch.arange(B, dtype=torch.int64) + 77
    position = torch.full((B,), 5 * r, dtype=torch.int64)
    temperature = torch.from_numpy(inputs.temperature)
    got = reference_verify_chain(
        logits, torch.from_numpy(inputs.draft_tokens), temperature, seed, position,
        q_ids=torch.from_numpy(inputs.q_ids), q_counts=torch.from_numpy(inputs.q_counts),
        denominator=C,
    )  # fmt: skip
    direct = reference_verify_chain(
        logits, torch.from_numpy(drafts), temperature, seed, position,
        q_ids=torch.from_numpy(ids), q_counts=torch.from_numpy(counts), denominator=C,
    )  # fmt: skip
    for b in range(B):
        if b in fallback:
            assert int(got.accepted[b]) == 0 and int((got.tokens[b] >= 0).sum()) == 1
            if float(temperature[b]) == 0.0:
                assert int(got.tokens[b, 0]) == int(torch.argmax(logits[b, 0]))
        else:
            assert torch.equal(got.tokens[b], direct.tokens[b])


MODES = ["process", "thread"]


@pytest.mark.parametrize("mode", MODES)
def test_mixed_t0_t1_rounds_all_verified(mode: proxy.Mode) -> None:
    results, stats, rids = _run(mode, ())
    assert set(_temperature().tolist()) == {0.0, float(np.float32(0.7))}
    _check(results, rids, {}, {})
    assert stats.frames_sent == stats.frames_received == stats.frames_accepted == B * ROUNDS
    assert stats.fallbacks == 0 and stats.frames_refused == 0 and not stats.drafter_lost
    if mode == "process":
        assert stats.drafter_exitcode == 0


@pytest.mark.parametrize("mode", MODES)
def test_drafter_crashing_mid_round(mode: proxy.Mode) -> None:
    results, stats, rids = _run(mode, (proxy.Fault("crash", 1, rids_at(5)),))
    # Round 1: requests before the crash were sent and verified; the rest fall back;
    # round 2: the drafter is gone, everyone falls back without waiting.
    _check(results, rids, {1: {5, 6, 7}, 2: set(range(B))}, {})
    assert stats.drafter_lost and stats.rounds_timed_out == 0
    assert stats.frames_received == B + 5
    if mode == "process":
        assert stats.drafter_exitcode == 17


def rids_at(b: int) -> int:
    return 200 + b


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("fault", "refused_reason", "fallback_reason"),
    [
        (proxy.Fault("corrupt", 1, rids_at(3)), "crc_mismatch", "missing"),
        (proxy.Fault("truncate", 1, rids_at(3)), "truncated", "missing"),
        (proxy.Fault("stale_generation", 1, rids_at(3)), "stale_generation", "stale_generation"),
        (proxy.Fault("replay", 1, rids_at(3)), "stale_sequence", "stale_sequence"),
        (proxy.Fault("bad_mass", 1, rids_at(3)), "missing_mass", "missing_mass"),
        (proxy.Fault("foreign", 1, rids_at(3), foreign_request_id=9999), "not_owned", "missing"),
        (proxy.Fault("drop", 1, rids_at(3)), None, "missing"),
    ],
    ids=lambda value: value.kind if isinstance(value, proxy.Fault) else None,
)
def test_one_bad_frame_falls_back_alone(
    mode: proxy.Mode, fault: proxy.Fault, refused_reason: str | None, fallback_reason: str
) -> None:
    if mode == "process" and fault.kind in {"truncate", "bad_mass", "drop"}:
        mode = "thread"  # same code path; keep the number of spawned processes small
    results, stats, rids = _run(mode, (fault,))
    _check(results, rids, {1: {3}}, {(1, 3): fallback_reason})
    refused = [(x.round_index, x.reason) for x in stats.refusals if not x.fallback]
    assert refused == ([] if refused_reason is None else [(1, refused_reason)])
    assert stats.fallbacks == 1 and not stats.drafter_lost
    assert stats.frames_accepted == B * ROUNDS - 1
    assert dict(stats.fallback_by_reason) == {fallback_reason: 1}
    assert stats.frames_refused == len(refused)
    assert dict(stats.refused_by_reason) == ({} if refused_reason is None else {refused_reason: 1})


def test_send_drafts_through_proxy_returns_what_was_sent() -> None:
    drafts, ids, counts, temperature = _batch(21, batch=40, positions=K, support=S)
    out = proxy.send_drafts_through_proxy(
        torch.from_numpy(drafts), torch.from_numpy(ids), torch.from_numpy(counts), C,
        torch.from_numpy(temperature), torch.arange(40) + 5000, 0,
        vocab_size=V, round_size=16, round_timeout_s=TIMEOUT_S,
    )  # fmt: skip
    got_drafts, got_ids, got_counts, stats = out
    assert isinstance(got_ids, torch.Tensor) and got_ids.shape == (40, K, S)
    assert torch.equal(got_drafts, torch.from_numpy(drafts))
    assert _law(got_ids.numpy(), got_counts.numpy()) == _law(ids, counts)
    summary = stats.to_json()
    assert summary["mode"] == "process" and summary["rounds"] == 3
    assert summary["frames_sent"] == summary["frames_received"] == 40
    assert summary["fallbacks"] == 0 and summary["frames_refused"] == 0


def test_send_drafts_through_proxy_counts_refusals() -> None:
    drafts, ids, counts, temperature = _batch(22, batch=10, positions=K, support=S)
    got_drafts, _, got_counts, stats = proxy.send_drafts_through_proxy(
        drafts, ids, counts, C, temperature, np.arange(10), 1, mode="thread",
        vocab_size=V, faults=(proxy.Fault("corrupt", 0, 4),), round_timeout_s=TIMEOUT_S,
    )  # fmt: skip
    assert (got_drafts[4] == -1).all() and (got_counts[4] == 0).all()
    np.testing.assert_array_equal(np.delete(got_drafts, 4, 0), np.delete(drafts, 4, 0))
    assert stats.fallbacks == 1 and dict(stats.refused_by_reason) == {"crc_mismatch": 1}


def test_the_documented_signature_is_the_functions() -> None:
    docs = (repo_root() / "docs" / "wire.md").read_text()
    documented = re.search(r"`send_drafts_through_proxy\((.*?)\)`", docs, re.S)
    assert documented is not None
    shown = " ".join(documented.group(1).split())
    parts: list[str] = []
    for parameter in inspect.signature(proxy.send_drafts_through_proxy).parameters.values():
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in parts:
            parts.append("*")
        default = parameter.default
        shown_default = "" if default is inspect.Parameter.empty else f"={default!r}"
        parts.append(parameter.name + shown_default)
    actual = ", ".join(parts)
    assert shown == actual.replace("'", '"')


def test_an_end_marker_is_exactly_sized_sealed_and_of_its_magic() -> None:
    marker = proxy._end_marker(7, 3)
    assert proxy._parse_end_marker(marker) == (7, 3)
    longer = seal(proxy.END.pack(proxy.END_MAGIC, 7, 3) + b"\x00")  # sealed, a byte longer
    assert proxy._parse_end_marker(longer) is None
    other = seal(proxy.END.pack(b"PP3F", 7, 3))  # sealed, right size, another magic
    assert proxy._parse_end_marker(other) is None
    broken = marker[:-1] + bytes([marker[-1] ^ 1])
    assert proxy._parse_end_marker(broken) is None


@pytest.mark.parametrize(
    "request_ids",
    [np.arange(9), np.array([0, 1, 2, 3, 4, 5, 6, 6]), np.array([0, 1, 2, 3, 4, 5, 6, -7])],
    ids=["short", "repeated", "negative"],
)
def test_request_ids_must_be_one_distinct_non_negative_id_per_row(
    request_ids: npt.NDArray[np.int64],
) -> None:
    drafts, ids, counts, temperature = _batch(23, batch=8, positions=K, support=S)
    with pytest.raises(ValueError, match="expected 8 distinct non-negative ids"):
        proxy.send_drafts_through_proxy(
            drafts, ids, counts, C, temperature, request_ids, 0, mode="thread", vocab_size=V
        )


def test_rounds_of_one_request_and_no_rounds_of_none() -> None:
    drafts, ids, counts, temperature = _batch(24, batch=3, positions=K, support=S)
    got_drafts, got_ids, got_counts, stats = proxy.send_drafts_through_proxy(
        drafts, ids, counts, C, temperature, np.arange(3), 0, mode="thread",
        vocab_size=V, round_size=1, round_timeout_s=TIMEOUT_S,
    )  # fmt: skip
    assert stats.rounds == 3 and stats.frames_accepted == 3 and stats.fallbacks == 0
    np.testing.assert_array_equal(got_drafts, drafts)
    assert _law(got_ids, got_counts) == _law(ids, counts)
    with pytest.raises(ValueError, match="round_size 0: expected >= 1"):
        proxy.send_drafts_through_proxy(
            drafts, ids, counts, C, temperature, np.arange(3), 0, mode="thread", round_size=0
        )


def test_a_proxy_needs_a_positive_deadline_and_closes_its_socket() -> None:
    with pytest.raises(ValueError, match="round_timeout_s 0: expected > 0"):
        proxy.DraftProxy(mode="thread", round_timeout_s=0)
    assert proxy.DraftProxy(mode="thread", round_timeout_s=0.5).round_timeout_s == 0.5
    with pytest.raises(ValueError, match="mode 'fork'"):
        proxy.DraftProxy(mode="fork")  # type: ignore[arg-type]
    draft_proxy = proxy.DraftProxy(mode="thread", round_timeout_s=TIMEOUT_S)
    draft_proxy.start()
    conn = draft_proxy._conn
    assert conn is not None and not conn.closed
    draft_proxy.close()
    assert conn.closed and draft_proxy._conn is None and draft_proxy._thread is None
    draft_proxy.close()  # closing twice is harmless


# ---- A scripted drafter: the test writes the drafter's side of the socket itself


RIDS = [rids_at(b) for b in range(B)]


def _scripted_round(
    messages: list[bytes], timeout_s: float
) -> tuple[RoundInputs, proxy.ProxyStats, RoundData]:
    """One round of B requests (RIDS) whose drafter 'sent' exactly ``messages``, then nothing."""
    data = _round_data(0)
    drafts, ids, counts, temperature = data
    receiver = DraftReceiver(
        slot="verifier-0", vocab_size=V, num_positions=K, support_width=S, denominator=C
    )
    for rid, temp in zip(RIDS, temperature.tolist(), strict=True):
        receiver.admit(rid, temperature=temp, generation=GENERATION)
    ours, theirs = multiprocessing.Pipe(duplex=True)
    draft_proxy = proxy.DraftProxy(mode="thread", round_timeout_s=timeout_s)
    draft_proxy._conn = ours  # the test is the drafter
    for message in messages:
        theirs.send_bytes(message)
    job = proxy.DraftJob(
        round_index=1, request_ids=RIDS, generations=[GENERATION] * B,
        draft_tokens=drafts, q_ids=ids, q_counts=counts, temperature=temperature, denominator=C,
    )  # fmt: skip
    try:
        inputs = draft_proxy.run_round(receiver, job)
    finally:
        draft_proxy.close()
        theirs.close()
    return inputs, draft_proxy.stats, data


def _frames(data: RoundData, rids: list[int]) -> list[bytes]:
    drafts, ids, counts, temperature = data
    return encode_frames(
        drafts, ids, counts, denominator=C, temperature=temperature,
        request_ids=np.array(rids, dtype=np.uint64),
        generation=np.full(len(rids), GENERATION, dtype=np.uint64),
        sequence=np.zeros(len(rids), dtype=np.uint64),
    )  # fmt: skip


def test_a_silent_drafter_times_the_round_out_at_its_deadline_and_everyone_falls_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = time.monotonic()
    inputs, stats, _ = _scripted_round([], timeout_s=0.3)
    took = time.monotonic() - started
    assert 0.3 <= took < 5.0, took
    assert stats.rounds_timed_out == 1 and stats.rounds == 1 and not stats.drafter_lost
    assert inputs.fallback.all() and stats.fallbacks == B
    assert dict(stats.fallback_by_reason) == {"missing": B} and stats.frames_refused == 0
    assert "round 1: no end marker within 0.3 s" in caplog.text


def test_another_rounds_end_marker_is_ignored_and_this_rounds_ends_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    frames = _frames(_round_data(0), RIDS)
    messages = [proxy._end_marker(0, 99), *frames, proxy._end_marker(1, B)]
    inputs, stats, data = _scripted_round(messages, timeout_s=TIMEOUT_S)
    assert not inputs.fallback.any() and stats.rounds_timed_out == 0
    assert stats.frames_sent == B and stats.frames_received == B == stats.frames_accepted
    np.testing.assert_array_equal(inputs.draft_tokens, data[0])
    assert "round 1: ignoring end marker of round 0" in caplog.text


def test_the_largest_legal_frame_is_read_and_a_byte_more_ends_the_drafter() -> None:
    drafts, ids, counts, temperature = _round_data(0)
    ids = np.broadcast_to(np.arange(S, dtype=np.int32) + 7, (B, K, S)).copy()
    counts = np.full((B, K, S), C // S, dtype=np.int32)  # every slot listed: the most bytes
    drafts = ids[:, :, 0].copy()
    full = (drafts, ids, counts, temperature)
    frames = _frames(full, RIDS)
    assert len(frames[0]) == MIN_FRAME_SIZE + 8 * K * (1 + S)
    inputs, stats, _ = _scripted_round([*frames, proxy._end_marker(1, B)], TIMEOUT_S)
    assert not inputs.fallback.any() and not stats.drafter_lost
    inputs, stats, _ = _scripted_round([frames[0] + b"\x00", *frames[1:]], TIMEOUT_S)
    assert stats.drafter_lost and inputs.fallback.all() and stats.frames_received == 0


def test_to_json_keeps_the_first_hundred_refusals_in_full() -> None:
    stats = proxy.ProxyStats(mode="thread")
    stats.refusals = [Refusal(0, i, "missing", f"request {i}", True) for i in range(101)]
    stats.fallback_by_reason["missing"] = 101
    record = stats.to_json()
    assert [r["request_id"] for r in record["refusals"]] == list(range(100))
    assert record["fallback_by_reason"] == {"missing": 101} and record["mode"] == "thread"


def test_the_transport_adds_every_calls_counts_and_carries_sparse_q_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pp3kernels import ChainInputs

    results = [
        proxy.ProxyStats(mode="process", rounds=1, frames_sent=3, frames_received=3,
                         frames_accepted=2, frames_refused=1, fallbacks=1,
                         refused_by_reason=Counter({"crc_mismatch": 1})),
        proxy.ProxyStats(mode="process", rounds=2, frames_sent=1, frames_received=1,
                         frames_accepted=0, frames_refused=1, fallbacks=3, rounds_timed_out=1,
                         drafter_lost=True, refused_by_reason=Counter({"bad_length": 1})),
    ]  # fmt: skip

    def fake(
        drafts: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor, *rest: object, **kw: object
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, object]:
        return drafts, ids, counts, results.pop(0)

    monkeypatch.setattr(proxy, "send_drafts_through_proxy", fake)
    zeros = torch.zeros(3, dtype=torch.int64)
    sparse = ChainInputs(
        torch.zeros(3, K + 1, V), torch.zeros(3, K, dtype=torch.int32), torch.ones(3), zeros,
        zeros, q_ids=torch.zeros(3, K, S, dtype=torch.int32),
        q_counts=torch.zeros(3, K, S, dtype=torch.int32), denominator=C,
    )  # fmt: skip
    transport = proxy.ProxyDraftTransport()
    for _ in range(2):
        transport(sparse, zeros, 0, V)
    assert transport.summary() == {
        "mode": "process", "calls": 2, "rounds": 3, "frames_sent": 4, "frames_received": 4,
        "frames_accepted": 2, "frames_refused": 2, "fallbacks": 4, "rounds_timed_out": 1,
        "refused_by_reason": {"bad_length": 1, "crc_mismatch": 1}, "drafter_lost_calls": 1,
    }  # fmt: skip
    for partial in (
        dataclasses.replace(sparse, q_ids=None),
        dataclasses.replace(sparse, q_counts=None),
        dataclasses.replace(sparse, denominator=None),
    ):
        with pytest.raises(ValueError, match="sparse integer q only"):
            transport(partial, zeros, 0, V)
    assert transport.calls == 2


def test_without_a_vocabulary_any_int32_id_below_its_largest_is_accepted() -> None:
    drafts, ids, counts, temperature = _batch(25, batch=2, positions=K, support=S)
    top = np.iinfo(np.int32).max  # 2^31 - 1: the bound itself, never an id
    ids[0, 0, np.flatnonzero(counts[0, 0])[0]] = top - 1
    got_drafts, got_ids, got_counts, stats = proxy.send_drafts_through_proxy(
        drafts, ids, counts, C, temperature, np.arange(2), 0, mode="thread",
        round_timeout_s=TIMEOUT_S,
    )  # fmt: skip
    assert stats.fallbacks == 0 and _law(got_ids, got_counts) == _law(ids, counts)
    ids[1, 0, np.flatnonzero(counts[1, 0])[0]] = top
    got_drafts, _, _, stats = proxy.send_drafts_through_proxy(
        drafts, ids, counts, C, temperature, np.arange(2), 0, mode="thread",
        round_timeout_s=TIMEOUT_S,
    )  # fmt: skip
    assert stats.fallbacks == 1 and (got_drafts[1] == -1).all()
    assert [r.reason for r in stats.refusals if not r.fallback] == ["support_id_range"]
