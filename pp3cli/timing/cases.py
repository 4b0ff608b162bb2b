"""The probe's cases: which configurations run, their bytes and their read-once floor.

Light (no torch, no numpy): the command line validates its options and lists the cases
(``--dry-run``) with these alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pp3cli.run.errors import UsageProblem

Number = TypeVar("Number", int, float)

DEFAULT_BATCHES = (1, 2, 3, 4, 16, 64, 256, 1024)
DEFAULT_DEPTHS = (4, 5)
DEFAULT_VOCAB = 129280
DEFAULT_T0_SHARES = (0.0, 0.5, 1.0)
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
DRAFT_KINDS = ("point", "sparse", "dense")
COMPARATORS = ("selector", "argmax", "reference", "vllm")
# The eager torch reference costs ~30 ms a call at V = 129280 (tens of seconds of wall time
# per case): a sanity anchor, run only when asked for (``--comparators``).
DEFAULT_COMPARATORS = ("selector", "argmax", "vllm")
LOGIT_SCALE = 4.0
POINT_DENOMINATOR = 1 << 16
SPARSE_COUNT = 1 << 10  # each of the S support ids gets this count; C = S * 1024
SUPPORT_STRIDE = 2003  # prime: ids (x + j * 2003) mod V are distinct for j < V when gcd = 1
MAX_INPUT_SETS = 64
NOMINAL_COPY_BANDWIDTH = 4.3e12  # bytes read + written per second, H200 (docs/probe.md)
SUMMARY_KEYS = ("n", "median", "p10", "p90", "min", "max")


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class ProbeConfig:
    """Everything that decides which cases run and how they are timed."""

    batches: tuple[int, ...] = DEFAULT_BATCHES
    depths: tuple[int, ...] = DEFAULT_DEPTHS
    vocab: int = DEFAULT_VOCAB
    dtype: str = "bf16"
    drafts: tuple[str, ...] = ("point",)
    t0_shares: tuple[float, ...] = DEFAULT_T0_SHARES
    support: int = 64
    rounds: int = 10
    warmup: int = 3
    replays: int = 100
    slow_replays: int = 3  # the eager torch reference (~30 ms a call at V = 129280)
    seed: int = 0
    rotate_inputs: bool = True
    require_vllm: bool = False
    comparators: tuple[str, ...] = DEFAULT_COMPARATORS

    def validate(self) -> None:
        """Raise ``UsageProblem`` naming the first bad value."""
        for name, values in (("--batch", self.batches), ("--depth", self.depths)):
            if not values or any(v < 1 for v in values):
                raise UsageProblem(f"{name} needs integers >= 1, got {list(values)}")
        if self.vocab < 2:
            raise UsageProblem(f"--vocab must be >= 2, got {self.vocab}")
        if self.dtype not in DTYPE_BYTES:
            raise UsageProblem(f"--dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        bad = [d for d in self.drafts if d not in DRAFT_KINDS]
        if not self.drafts or bad:
            raise UsageProblem(f"--draft takes {', '.join(DRAFT_KINDS)}; got {list(self.drafts)}")
        if not self.t0_shares or any(not 0.0 <= s <= 1.0 for s in self.t0_shares):
            raise UsageProblem(f"--t0-share needs values in [0, 1], got {list(self.t0_shares)}")
        needs_support = any(d != "point" for d in self.drafts)
        support_ok = 2 <= self.support <= 1 << 14 and self.support & (self.support - 1) == 0
        if needs_support and (not support_ok or self.support > self.vocab):
            raise UsageProblem(
                f"--support must be a power of two in [2, min(16384, V={self.vocab})], "
                f"got {self.support}"
            )
        if math.gcd(SUPPORT_STRIDE, self.vocab) != 1 and needs_support:
            raise UsageProblem(f"--vocab {self.vocab} shares a factor with {SUPPORT_STRIDE}")
        unknown = [c for c in self.comparators if c not in COMPARATORS]
        if not self.comparators or unknown or len(set(self.comparators)) != len(self.comparators):
            raise UsageProblem(
                f"--comparators takes distinct names from {', '.join(COMPARATORS)}; "
                f"got {list(self.comparators)}"
            )
        if self.require_vllm and "vllm" not in self.comparators:
            raise UsageProblem("--require-vllm needs vllm among --comparators")
        for name, value, low in (
            ("--rounds", self.rounds, 1),
            ("--warmup", self.warmup, 0),
            ("--replays", self.replays, 1),
            ("--slow-replays", self.slow_replays, 1),
        ):
            if value < low:
                raise UsageProblem(f"{name} must be >= {low}, got {value}")


def _parse_list(
    text: str, option: str, convert: Callable[[str], Number], kind: str
) -> tuple[Number, ...]:
    """Comma-separated values; ``UsageProblem`` naming the option and the bad item."""
    values = []
    for item in text.split(","):
        try:
            values.append(convert(item.strip()))
        except ValueError:
            raise UsageProblem(f"{option}: {item.strip()!r} is not {kind} ({text!r})") from None
    return tuple(values)


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4)."""
    return _parse_list(text, option, int, "an integer")


def parse_float_list(text: str, option: str) -> tuple[float, ...]:
    """``"0,0.5,1"`` -> (0.0, 0.5, 1.0)."""
    return _parse_list(text, option, float, "a number")


def parse_name_list(text: str) -> tuple[str, ...]:
    """``"point,sparse"`` -> ("point", "sparse")."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


@dataclass(frozen=True)
class ProbeCase:
    """One timed configuration."""

    batch: int
    depth: int
    vocab: int
    dtype: str
    draft: str
    t0_rows: int
    support: int

    @property
    def name(self) -> str:
        return f"B{self.batch}K{self.depth} {self.draft} T0 {self.t0_rows}/{self.batch}"

    @property
    def support_size(self) -> int:
        """S: ids per draft in the sparse q (1 for point drafts, V for dense)."""
        return {"point": 1, "sparse": self.support, "dense": self.vocab}[self.draft]

    def logits_bytes(self) -> int:
        return self.batch * (self.depth + 1) * self.vocab * DTYPE_BYTES[self.dtype]

    def bytes_read(self) -> int:
        """Bytes the selector must read: logits, drafts, q, temperature/seed/position.

        logits B(K+1)V*itemsize; drafts 4BK; q: point/sparse ids + counts 8BKS, dense
        4BKV (fp32); per request 4 (temperature) + 8 (seed) + 8 (position).
        """
        b, k = self.batch, self.depth
        q_bytes = 4 * b * k * self.vocab if self.draft == "dense" else 8 * b * k * self.support_size
        return self.logits_bytes() + 4 * b * k + q_bytes + 20 * b


def t0_count(batch: int, share: float) -> int:
    """Rows at temperature 0: round half up of share * B."""
    return min(batch, math.floor(share * batch + 0.5))


def t0_mask_list(batch: int, t0_rows: int) -> list[bool]:
    """Which requests are T0: spread evenly (request b is T0 iff floor((b+1)t/B) > floor(bt/B))."""
    return [(b + 1) * t0_rows // batch > b * t0_rows // batch for b in range(batch)]


def build_cases(config: ProbeConfig) -> list[ProbeCase]:
    """Cases in (draft, depth, batch, T0 share) order; equal T0 row counts run once."""
    config.validate()
    cases: list[ProbeCase] = []
    for draft in config.drafts:
        for depth in config.depths:
            for batch in config.batches:
                for share in config.t0_shares:
                    case = ProbeCase(
                        batch=batch,
                        depth=depth,
                        vocab=config.vocab,
                        dtype=config.dtype,
                        draft=draft,
                        t0_rows=t0_count(batch, share),
                        support=config.support,
                    )
                    if case not in cases:
                        cases.append(case)
    return cases


def floor_us(bytes_read: int, copy_bandwidth: float) -> float:
    """Time to stream ``bytes_read`` at the copy bandwidth (bytes/s), in µs."""
    return bytes_read / copy_bandwidth * 1e6


def input_set_count(case_bytes: int, l2_bytes: int, *, rotate: bool, budget_bytes: int) -> int:
    """Input sets so that the rotation touches >= 2 x L2 bytes (1 when rotation is off)."""
    if not rotate or case_bytes <= 0:
        return 1
    wanted = math.ceil(2 * l2_bytes / case_bytes)
    affordable = max(1, budget_bytes // case_bytes)
    return max(1, min(wanted, MAX_INPUT_SETS, affordable))
