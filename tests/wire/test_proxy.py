"""The real proxy: a drafter in a spawned OS process (and a thread), frames over a socketpair.

Each scenario ends with the right requests falling back (K = 0 rows), every other request
verified with its drafts intact, and nothing lost: every scheduled request of every round
is either intact or listed as a fallback with its reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pytest
import torch
from test_wire import I32, C, V, _batch, _law

from pp3cli.wire import proxy
from pp3cli.wire.receiver import DraftReceiver, RoundInputs

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
