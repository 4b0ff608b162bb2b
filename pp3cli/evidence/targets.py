"""The fixed toy targets that ``pp3 qualify`` runs, with their draft policies.

A target is a chain of K+1 target rows p_0..p_K over a small vocabulary V, each row a
dyadic law p_i(v) = w_i(v) / 2^b (integer weights), plus K integer draft rows q_i given
as sparse counts over a power-of-two denominator C. Drafts are drawn from q by the draft
sampler (``pp3kernels.sample_drafts``), so their law is exactly q. For a share of the
requests (odd request index) one draft row may be invalidated (set to -1).

Logits realise p at temperature tau: l_v = tau * ln p_v in fp32 (p_v = 0 -> -inf), so
softmax(l / tau) = p up to fp32 rounding. For a power-of-two tau, l / tau recovers
fp32(ln p_v) exactly and the only rounding is that of ln, exp and the sum; any other tau
(one target has tau = 0.7, as engines use) adds one relative rounding of 2^-24 to each
l / tau (``rounding_gap`` measures the total in fp64: below 1e-7 in total variation).

A target's q reaches the verifier in one of the two public forms (``q_form``): sparse
integer counts (ids, counts over C), or dense q [K, V] as fp32 probabilities count / C,
which are exact in fp32 (C is a power of two), so both forms state the same exact law. A row whose
positive weights are all equal is written as signed zeros (+0.0, -0.0 alternating): then
exp(l - max) = 1 exactly and the fp32 softmax is exact, which is what lets a row have
q = p without a rounding-induced rejection.

Every draft token with q(x) > 0 has either p(x) = q(x) on such an exact row, or
|p(x) - q(x)| far above fp32 rounding, so a probability that is 0 in exact arithmetic
(e.g. rejection when q <= p everywhere) is also unreachable in fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from pp3cli.evidence.exact import RowStep, row_step

if TYPE_CHECKING:
    import torch

__all__ = ["TARGETS", "ToyTarget", "rounding_gap", "target_by_name"]


@dataclass(frozen=True)
class ToyTarget:
    """One fixed toy target: K+1 dyadic target rows, K integer draft rows, a temperature.

    ``weights[i][v] / 2**bits`` is p_i(v); ``draft[i]`` is a tuple of (token id, count)
    pairs over ``denominator`` (same support size S on every row); ``invalid_row`` is
    the draft row replaced by -1 for odd request indices (None: never); ``q_form`` is how
    q reaches the verifier ("sparse" ids/counts or "dense" fp32 probabilities).
    """

    name: str
    purpose: str
    draft_policy: str
    tau: float
    bits: int
    weights: tuple[tuple[int, ...], ...]
    draft: tuple[tuple[tuple[int, int], ...], ...]
    denominator: int
    invalid_row: int | None = None
    q_form: str = "sparse"  # how q reaches the verifier: "sparse" counts or "dense" [K, V]
    # Most requests per profile (profile name -> cap) for a target too costly to run at the
    # family's size; its detectable TV is then stated per target in the receipt. Such a
    # target judges the verifier only: the planted-defect controls skip it.
    requests_cap: tuple[tuple[str, int], ...] = ()

    def requests(self, profile: str, n: int) -> int:
        """This target's requests when the family runs ``n`` per target under ``profile``."""
        return min(n, dict(self.requests_cap).get(profile, n))

    @property
    def capped(self) -> bool:
        """True when some profile caps this target's requests (it then skips the controls)."""
        return bool(self.requests_cap)

    @property
    def k(self) -> int:
        """Number of draft positions K."""
        return len(self.draft)

    @property
    def vocab(self) -> int:
        """Vocabulary size V."""
        return len(self.weights[0])

    @property
    def support(self) -> int:
        """Sparse draft support size S."""
        return len(self.draft[0])

    def p(self, row: int) -> tuple[Fraction, ...]:
        """Exact target law p_row as Fractions."""
        total = 1 << self.bits
        return tuple(Fraction(w, total) for w in self.weights[row])

    def q(self, row: int) -> tuple[Fraction, ...]:
        """Exact draft law q_row (dense, length V) as Fractions."""
        dense = [Fraction(0)] * self.vocab
        for token, count in self.draft[row]:
            dense[token] = Fraction(count, self.denominator)
        return tuple(dense)

    def validate(self) -> None:
        """Check the target's own consistency; raise ValueError naming what is wrong."""
        k, vocab = self.k, self.vocab
        if len(self.weights) != k + 1:
            raise ValueError(f"{self.name}: {len(self.weights)} target rows, expected K+1={k + 1}")
        if not (math.isfinite(self.tau) and self.tau > 0):
            raise ValueError(f"{self.name}: tau={self.tau} must be positive and finite")
        if self.q_form not in ("sparse", "dense"):
            raise ValueError(f"{self.name}: q_form {self.q_form!r} is not 'sparse' or 'dense'")
        if self.denominator & (self.denominator - 1):
            raise ValueError(f"{self.name}: denominator {self.denominator} not a power of two")
        for i, row in enumerate(self.weights):
            if len(row) != vocab or sum(row) != 1 << self.bits or min(row) < 0:
                raise ValueError(
                    f"{self.name}: row {i} weights {row} must be {vocab} non-negative "
                    f"integers summing to 2^{self.bits}"
                )
        for i, pairs in enumerate(self.draft):
            ids = [t for t, _ in pairs]
            if len(pairs) != self.support or len(set(ids)) != len(ids):
                raise ValueError(f"{self.name}: draft row {i} {pairs} needs S distinct ids")
            if any(not 0 <= t < vocab or c <= 0 for t, c in pairs):
                raise ValueError(f"{self.name}: draft row {i} {pairs} has a bad id or count")
            if sum(c for _, c in pairs) != self.denominator:
                raise ValueError(f"{self.name}: draft row {i} mass != {self.denominator}")
        if self.invalid_row is not None and not 0 <= self.invalid_row < k:
            raise ValueError(f"{self.name}: invalid_row {self.invalid_row} outside [0, {k})")

    def exact_row(self, row: int) -> bool:
        """True when all positive weights of the row are equal (fp32 softmax is exact)."""
        return len({w for w in self.weights[row] if w > 0}) == 1

    def steps(self, *, invalid: bool) -> list[RowStep]:
        """The exact chain steps (``pp3cli.evidence.exact.row_step``) of one request.

        ``invalid``: the request's draft row ``invalid_row`` is -1 (odd request indices).
        """
        return [
            row_step(self.p(i), None if invalid and i == self.invalid_row else self.q(i))
            for i in range(self.k)
        ] + [row_step(self.p(self.k), None)]

    def logits(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """fp32 logits [K+1, V]: tau * ln p (−inf where p = 0; signed zeros on exact rows)."""
        import torch

        rows: list[list[float]] = []
        for i, row in enumerate(self.weights):
            total = float(1 << self.bits)
            if self.exact_row(i):
                signs = [0.0, -0.0]
                values = [signs[v % 2] if w > 0 else -math.inf for v, w in enumerate(row)]
            else:
                values = [self.tau * math.log(w / total) if w > 0 else -math.inf for w in row]
            rows.append(values)
        return torch.tensor(rows, dtype=torch.float32, device=device)

    def q_dense(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Dense draft law [K, V] fp32: count / C, exact in fp32 (C is a power of two)."""
        import torch

        return torch.tensor(
            [[float(x) for x in self.q(i)] for i in range(self.k)],
            dtype=torch.float32,
            device=device,
        )

    def q_tensors(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Sparse draft law as (ids [K, S] int32, counts [K, S] int32)."""
        import torch

        ids = [[t for t, _ in pairs] for pairs in self.draft]
        counts = [[c for _, c in pairs] for pairs in self.draft]
        return (
            torch.tensor(ids, dtype=torch.int32, device=device),
            torch.tensor(counts, dtype=torch.int32, device=device),
        )


def rounding_gap(target: ToyTarget) -> float:
    """Largest total variation over rows between exact p and the fp32 softmax of the logits.

    The fp32 softmax is computed as the contract states (m = max, e = exp((l - m) / tau),
    p = e / sum e, all fp32) and compared with the exact dyadic p in fp64.
    """
    import torch

    logits = target.logits()
    scaled = logits / target.tau
    e = torch.exp(scaled - scaled.max(dim=-1, keepdim=True).values)
    p32 = (e / e.sum(dim=-1, keepdim=True)).double()
    exact = torch.tensor(
        [[float(x) for x in target.p(i)] for i in range(target.k + 1)], dtype=torch.float64
    )
    return float(0.5 * (p32 - exact).abs().sum(dim=-1).max())


def _roll(row: tuple[int, ...], shift: int) -> tuple[int, ...]:
    shift %= len(row)
    return row[-shift:] + row[:-shift] if shift else row


_TAILS = (1600, 900, 600, 400, 250, 150, 80, 50, 30, 16, 8, 4, 4, 2, 1, 1)  # / 2^12


def _tails_draft(row: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    order = sorted(range(len(row)), key=lambda v: (-row[v], v))
    tail = max(range(len(row)), key=lambda v: (-row[v], v))  # the highest-id lightest token
    return ((order[0], 128), (order[1], 64), (tail, 64))


_TAIL_ROWS = tuple(_roll(_TAILS, 5 * i) for i in range(4)) + (tuple(reversed(_TAILS)),)

_INVALID_BASE = (20, 12, 8, 6, 5, 4, 3, 2, 1, 1, 1, 1)  # / 64
_INVALID_ROWS = tuple(_roll(_INVALID_BASE, 2 * i) for i in range(5)) + (
    tuple(reversed(_INVALID_BASE)),
)


def _top4_draft(row: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    order = sorted(range(len(row)), key=lambda v: (-row[v], v))[:4]
    return tuple(zip(order, (360, 260, 220, 184), strict=True))


# wide_support: V = 300, S = 256 draft ids 44..299 at q = 1/256 each (C = 2^16).
_WIDE_VOCAB = 300
_WIDE_SUPPORT = tuple(range(44, _WIDE_VOCAB))
_WIDE_ROW0 = tuple(
    56 if v < 8 else 60 if 44 <= v < 52 else 2 if 52 <= v < 100 else 0 for v in range(_WIDE_VOCAB)
)  # / 2^10: 8 tokens outside q's support, 8 with p > q, 48 with p < q, 200 support ids p = 0
_WIDE_ROW1 = tuple(64 if v >= _WIDE_VOCAB - 16 else 0 for v in range(_WIDE_VOCAB))

# split_vocab: a real vocabulary size, so that the split-vocabulary launch runs (chunks of
# 2048 tokens on a GPU, 8192 in the interpreter); p and q sit on both sides of chunk
# boundaries of both.
_SPLIT_VOCAB = 32768
_SPLIT_ROW0 = {0: 128, 2047: 128, 2048: 128, 16383: 128, 16384: 128, 30000: 128, 32767: 256}
_SPLIT_ROW1 = dict.fromkeys((2047, 2048, 8191, 8192, 16383, 16384, 24575, 24576), 128)


def _sparse_row(weights: dict[int, int], vocab: int) -> tuple[int, ...]:
    return tuple(weights.get(v, 0) for v in range(vocab))


TARGETS: tuple[ToyTarget, ...] = (
    ToyTarget(
        name="sparse_tails",
        purpose=(
            "Full-support rows with far tails (p = 2^-12): a sampler that can never reach "
            "the tail (e.g. fp32 exponential noise floored at 2^-24) or an unclipped "
            "residual (q = 1/4 on a 2^-12 tail token) shows in the slot laws."
        ),
        draft_policy=(
            "S = 3 over C = 256: q = 1/2 on the row's heaviest token, 1/4 on the second, "
            "1/4 on its lightest tail token; q > p on all three, so the residual is clipped."
        ),
        tau=1.0,
        bits=12,
        weights=_TAIL_ROWS,
        draft=tuple(_tails_draft(r) for r in _TAIL_ROWS[:4]),
        denominator=256,
    ),
    ToyTarget(
        name="disjoint_support",
        purpose=(
            "Sparse rows with -inf masks at a sharp temperature (tau = 1/4) and drafts that "
            "put mass where p = 0: such a proposal must never be accepted (strict U < p/q)."
        ),
        draft_policy=(
            "S = 2 over C = 64 per row, one id inside and one outside the row's support "
            "(row 4: both inside, q > p on one of them), so acceptance is 1/2, 1/2, 5/8, "
            "3/4, 3/8."
        ),
        tau=0.25,
        bits=6,
        weights=(
            (32, 16, 8, 8, 0, 0, 0, 0),
            (0, 0, 8, 8, 16, 32, 0, 0),
            (0, 40, 0, 0, 0, 0, 24, 0),
            (4, 4, 4, 4, 48, 0, 0, 0),
            (0, 0, 0, 16, 0, 16, 16, 16),
            (8, 0, 8, 0, 8, 0, 40, 0),
        ),
        draft=(
            ((0, 40), (6, 24)),
            ((5, 40), (7, 24)),
            ((1, 48), (3, 16)),
            ((4, 56), (5, 8)),
            ((3, 8), (7, 56)),
        ),
        denominator=64,
    ),
    ToyTarget(
        name="equal_q_ties",
        purpose=(
            "Tied logits written as signed zeros (+0.0/-0.0) at a flat temperature "
            "(tau = 4): rows 0 and 3 have q = p exactly (always accepted), row 1 has "
            "q = p on two tokens and q > p on the other two (residual exactly 0 on all "
            "four); row 2 is invalidated for odd "
            "requests, so the law is an exact 1/2-1/2 mixture. q is given dense, so the "
            "verifier's dense-q path is judged by its law."
        ),
        draft_policy=(
            "S = 4 over C = 8, passed as dense q [K, V] (count / 8, exact in fp32): uniform "
            "on the row's support where q = p; elsewhere q > p on every proposed token. "
            "Draft row 2 is -1 for odd request indices."
        ),
        tau=4.0,
        bits=4,
        weights=(
            (4, 4, 4, 4, 0, 0, 0, 0),
            (2, 2, 2, 2, 2, 2, 2, 2),
            (4, 4, 2, 2, 1, 1, 1, 1),
            (0, 0, 0, 0, 4, 4, 4, 4),
            (1, 2, 4, 8, 0, 0, 0, 1),
        ),
        draft=(
            ((0, 2), (1, 2), (2, 2), (3, 2)),
            ((1, 4), (3, 2), (5, 1), (7, 1)),
            ((0, 4), (3, 2), (4, 1), (7, 1)),
            ((4, 2), (5, 2), (6, 2), (7, 2)),
        ),
        denominator=8,
        invalid_row=2,
        q_form="dense",
    ),
    ToyTarget(
        name="invalidated_proposals",
        purpose=(
            "K = 5 with draft row 1 invalidated (-1) for odd requests: those must emit "
            "from p_1 itself and stop; a verifier that treats -1 as a rejection or reads "
            "past it shifts the accepted-length and joint laws."
        ),
        draft_policy=(
            "S = 4 over C = 1024 on the row's four heaviest tokens, counts 360/260/220/184 "
            "(q > p on each); draft row 1 is -1 for odd request indices."
        ),
        tau=1.0,
        bits=6,
        weights=_INVALID_ROWS,
        draft=tuple(_top4_draft(r) for r in _INVALID_ROWS[:5]),
        denominator=1024,
        invalid_row=1,
    ),
    ToyTarget(
        name="point_mass_positions",
        purpose=(
            "Point-mass drafts (the usual engine case) with a different heavy token per "
            "row at tau = 0.7, a temperature that is not a power of two (l / tau is then "
            "rounded too): deep chains make the bonus row well sampled, so a bonus "
            "drawn from the wrong row, a mix-up between positions or a reused coin shows."
        ),
        draft_policy="S = 1, count = C = 2^16: row i always proposes token i (p = 3/4).",
        tau=0.7,
        bits=5,
        weights=(
            (24, 4, 2, 1, 1),
            (2, 24, 4, 1, 1),
            (1, 2, 24, 4, 1),
            (1, 1, 2, 24, 4),
            (4, 1, 1, 2, 24),
        ),
        draft=(((0, 1 << 16),), ((1, 1 << 16),), ((2, 1 << 16),), ((3, 1 << 16),)),
        denominator=1 << 16,
    ),
    ToyTarget(
        name="wide_support",
        purpose=(
            "A large draft support (S = 256, as a tree or top-k drafter emits) over V = 300: "
            "the verifier's support bookkeeping (duplicate checks, the support correction "
            "of the residual) at full width. 200 of the 256 proposed ids have p = 0 and must "
            "never be accepted; 48 have p < q; the residual lives on 16 tokens."
        ),
        draft_policy=(
            "K = 1, S = 256 over C = 2^16: q = 1/256 on ids 44..299; the bonus row is 16 "
            "tied tokens (signed zeros). Costly in Triton's interpreter, so its requests are "
            "capped per profile and its detectable TV is stated on its own."
        ),
        tau=1.0,
        bits=10,
        weights=(_WIDE_ROW0, _WIDE_ROW1),
        draft=(tuple((token, 256) for token in _WIDE_SUPPORT),),
        denominator=1 << 16,
        requests_cap=(("smoke", 256), ("seed", 512), ("strict", 1 << 20), ("exhaustive", 1 << 20)),
    ),
    ToyTarget(
        name="split_vocab",
        purpose=(
            "A real vocabulary size (V = 32768), which a GPU verifies with the "
            "split-vocabulary launch (chunks of 2048 tokens): p, q and the residual sit on "
            "both sides of chunk boundaries (ids 2047/2048, 16383/16384), so chunk masses, "
            "the support correction of the residual across chunks and the exact rescan "
            "inside the chosen chunk are judged by their law; the bonus row is 8 tied "
            "tokens (signed zeros) straddling four boundaries."
        ),
        draft_policy=(
            "K = 1, S = 4 over C = 1024: q = 5/16 on 2047 (p = 1/8), 1/16 on 16384 "
            "(p = 1/8), 7/16 on 24576 (p = 0, never accepted), 3/16 on 32767 (p = 1/4). "
            "Capped per profile: each request reads 2 x 32768 logits."
        ),
        tau=1.0,
        bits=10,
        weights=(_sparse_row(_SPLIT_ROW0, _SPLIT_VOCAB), _sparse_row(_SPLIT_ROW1, _SPLIT_VOCAB)),
        draft=(((2047, 320), (16384, 64), (24576, 448), (32767, 192)),),
        denominator=1024,
        requests_cap=(("smoke", 128), ("seed", 256), ("strict", 1 << 20), ("exhaustive", 1 << 20)),
    ),
)


def target_by_name(name: str) -> ToyTarget:
    """Look a target up by name; raise ValueError listing the known names."""
    for target in TARGETS:
        if target.name == name:
            return target
    known = ", ".join(t.name for t in TARGETS)
    raise ValueError(f"unknown target {name!r}; expected one of {known}")
