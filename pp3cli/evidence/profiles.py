"""How big an evidence run is: qualification profiles and the pre-registered constants.

Light on purpose (no torch, no scipy): the command line reads its defaults from here.

- ``ALPHA``: the family-wise false-failure rate of ``qualify`` and ``oracle`` (Holm).
- ``POWER``: the power a run is sized for, against a total-variation deviation ``tv``.
- ``MIN_EXPECTED``: cells are pooled from the exact law until each expects this many.
- ``MIN_REPEATS``: every target's requests are split into at least this many verifier calls,
  so a verifier whose Philox counters are keyed by the batch index reuses its randomness
  at least this often (its counts inflate at least this many-fold and the family sees it);
  ``CAPPED_REPEATS`` for the costly capped targets.
"""

from __future__ import annotations

from dataclasses import dataclass

ALPHA = 1e-5
POWER = 0.99
MIN_EXPECTED = 20.0
MIN_REPEATS = 16
# A capped target (``ToyTarget.requests_cap``) is split into this many calls only: its cost
# in Triton's interpreter is per call, and the batch-index defect is the uncapped targets'
# to catch (the controls skip capped targets).
CAPPED_REPEATS = 2


@dataclass(frozen=True)
class Profile:
    """How big a qualification is: requests per target (or a TV to size it), batch, pairs."""

    name: str
    requests: int | None  # per target; None: sized from ``tv``
    tv: float | None
    batch: int  # most requests per verifier call
    n_greedy: int  # paired T0 requests
    repeats: int = MIN_REPEATS  # at least this many verifier calls per target
    control_tv: float | None = None  # controls sized for this TV (None: the verifier's size)


PROFILES: dict[str, Profile] = {
    "smoke": Profile("smoke", requests=2000, tv=None, batch=1024, n_greedy=1000, repeats=8),
    "seed": Profile("seed", requests=20_000, tv=None, batch=8192, n_greedy=100_000),
    "strict": Profile("strict", requests=None, tv=1e-3, batch=1 << 22, n_greedy=1_000_000),
    # ~11x strict's requests (n grows as 1/tv^2): meant for several GPUs (`--gpus N`). The
    # planted-defect controls stay at strict's size: they already fail there by far (their
    # deviations are far above TV 1e-3), and at the verifier's size they would be 8/9 of the run.
    "exhaustive": Profile(
        "exhaustive",
        requests=None,
        tv=3e-4,
        batch=1 << 22,
        n_greedy=1_000_000,
        control_tv=1e-3,
    ),
}

# `pp3 oracle`: requests per draft policy.
ORACLE_REQUESTS_GPU = 200_000
ORACLE_REQUESTS_CPU = 20_000
