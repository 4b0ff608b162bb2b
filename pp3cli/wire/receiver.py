"""The verifier's side of the draft wire: per-request state, and frames -> selector inputs.

A :class:`DraftReceiver` serves one verifier slot. It owns a set of requests; for each it
keeps the verifier's temperature, the current generation and the next expected sequence
number. :meth:`DraftReceiver.receive_round` turns whatever bytes arrived for one round into
fixed-shape selector inputs (``draft_tokens`` [B, K], ``q_ids``/``q_counts`` [B, K, S],
``temperature`` [B]).

A frame reaches the selector only if it decodes and validates (``pp3cli.wire.frames``) *and*
its header matches the request's state: owned by this slot, scheduled in this round,
current generation, sequence == next expected, K/S/C of this receiver, the verifier's own
temperature, and exactly one such frame for the request in the round.

Fallback (K = 0 in a fixed-shape batch). A request without such a frame is verified
target-only for the round: its row gets ``draft_tokens = -1`` at every position and
all-padding q (ids -1, counts 0). Under the selector contract, a proposal of -1 at
position 0 stops the chain there: a T1 request emits one token z ~ p_0, a T0 request emits
the greedy token argmax p_0 -- exactly a K = 0 verification, without changing the batch
shape. Every refusal and every fallback is logged (logger ``pp3cli.wire.receiver``) with the
request id and the reason, and kept in :attr:`DraftReceiver.refusals`.

Sequence numbers count rounds: the drafter sends sequence s for the request's s-th round
in the current generation, and the receiver advances every scheduled request by one per
round whether or not its frame arrived, so a late frame is refused as stale and the next
round's frame is still accepted.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pp3cli.wire.frames import FrameHeader, WireError, decode_frames
from pp3kernels.contract import NO_TOKEN

if TYPE_CHECKING:
    import torch

    from pp3kernels import ChainInputs

LOGGER = logging.getLogger(__name__)

MISSING = "missing"  # fallback reason: no frame at all arrived for the request


class NotOwnedError(WireError):
    """A frame for a request this verifier slot does not own."""

    reason = "not_owned"


class UnscheduledFrameError(WireError):
    """A frame for an owned request that is not in this round's batch."""

    reason = "not_scheduled"


class GenerationError(WireError):
    """A frame whose generation is not the request's current one."""

    reason = "generation"


class StaleGenerationError(GenerationError):
    """Generation older than the request's current one (a replay after a reset)."""

    reason = "stale_generation"


class FutureGenerationError(GenerationError):
    """Generation newer than any this receiver has issued."""

    reason = "future_generation"


class SequenceError(WireError):
    """A sequence number that is not the next expected one."""

    reason = "sequence"


class StaleSequenceError(SequenceError):
    """Sequence below the next expected one: a late or replayed frame."""

    reason = "stale_sequence"


class SequenceGapError(SequenceError):
    """Sequence above the next expected one: frames were skipped."""

    reason = "sequence_gap"


class DuplicateFrameError(WireError):
    """More than one valid frame for one request in one round (all of them are refused)."""

    reason = "duplicate_frame"


class FrameShapeError(WireError):
    """K, S or the denominator differ from this receiver's batch."""

    reason = "shape"


class TemperatureMismatchError(WireError):
    """The frame's temperature differs from the verifier's own for that request."""

    reason = "temperature_mismatch"


@dataclass(frozen=True)
class Refusal:
    """One refused frame, or one request that fell back (``fallback`` True)."""

    round_index: int
    request_id: int | None  # None: the frame failed before its id could be trusted
    reason: str
    message: str
    fallback: bool = False

    def to_json(self) -> dict[str, Any]:
        """Plain dict for receipts."""
        return {
            "round": self.round_index,
            "request_id": self.request_id,
            "reason": self.reason,
            "message": self.message,
            "fallback": self.fallback,
        }


@dataclass
class RequestState:
    """What the verifier knows about one owned request."""

    request_id: int
    temperature: float  # fp32 value, 0 = T0
    generation: int
    next_sequence: int


@dataclass
class RoundInputs:
    """Selector inputs for one round (numpy; :meth:`chain_inputs` gives the verifier's)."""

    round_index: int
    request_ids: list[int]
    draft_tokens: npt.NDArray[np.int32]  # [B, K], -1 everywhere on fallback rows
    q_ids: npt.NDArray[np.int32]  # [B, K, S]
    q_counts: npt.NDArray[np.int32]  # [B, K, S]
    temperature: npt.NDArray[np.float32]  # [B], the verifier's own
    denominator: int
    fallback: npt.NDArray[np.bool_]  # [B] True where the request is verified target-only
    refusals: list[Refusal]

    def chain_inputs(
        self, logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor
    ) -> ChainInputs:
        """The round's verifier inputs on the logits' device (CPU tensors share memory).

        ``logits`` [B, K+1, V] and ``seed``/``position`` [B] come from the verifier's side;
        drafts, q and temperature from the frames (fallback rows as described above).
        """
        import torch

        from pp3kernels import ChainInputs

        def tensor(array: npt.NDArray[Any]) -> torch.Tensor:
            return torch.from_numpy(array).to(logits.device)

        return ChainInputs(
            logits,
            tensor(self.draft_tokens),
            tensor(self.temperature),
            seed,
            position,
            q_ids=tensor(self.q_ids),
            q_counts=tensor(self.q_counts),
            denominator=self.denominator,
        )


@dataclass
class ReceiverStats:
    """Counters over the receiver's lifetime."""

    rounds: int = 0
    frames_received: int = 0
    frames_accepted: int = 0
    frames_refused: int = 0
    requests_verified: int = 0
    fallbacks: int = 0
    refused_by_reason: Counter[str] = field(default_factory=Counter)
    fallback_by_reason: Counter[str] = field(default_factory=Counter)

    def to_json(self) -> dict[str, Any]:
        """Plain dict for receipts (keys sort when the receipt is canonicalised)."""
        reasons = {"refused_by_reason", "fallback_by_reason"}
        return {
            name: dict(value) if name in reasons else value for name, value in vars(self).items()
        }


class DraftReceiver:
    """Per-slot receiver: owned requests' state, validation, and target-only fallback."""

    def __init__(
        self,
        *,
        slot: str,
        vocab_size: int,
        num_positions: int,
        support_width: int,
        denominator: int,
        logger: logging.Logger | None = None,
    ) -> None:
        if vocab_size < 1 or num_positions < 1 or support_width < 1:
            raise ValueError(
                f"vocab_size {vocab_size}, K {num_positions}, S {support_width}: each must be >= 1"
            )
        if not (1 <= denominator <= 1 << 24) or denominator & (denominator - 1):
            raise ValueError(f"denominator {denominator}: expected a power of two <= 2^24")
        self.slot = slot
        self.vocab_size = vocab_size
        self.num_positions = num_positions
        self.support_width = support_width
        self.denominator = denominator
        self.logger = logger or LOGGER
        self.refusals: list[Refusal] = []
        self.stats = ReceiverStats()
        self._round = 0
        self._requests: dict[int, RequestState] = {}

    # ----- ownership and state -------------------------------------------------------
    def admit(self, request_id: int, *, temperature: float, generation: int = 0) -> None:
        """Take ownership of ``request_id`` at ``generation`` (next sequence 0)."""
        if request_id in self._requests:
            raise ValueError(f"request {request_id} is already owned by slot {self.slot!r}")
        value = float(np.float32(temperature))
        if not np.isfinite(value) or value < 0.0:
            raise ValueError(f"request {request_id}: temperature {temperature} must be >= 0")
        self._requests[request_id] = RequestState(request_id, value, generation, 0)

    def release(self, request_id: int) -> None:
        """Give up ``request_id``; later frames for it are refused as not owned."""
        self._requests.pop(self._owned(request_id).request_id)

    def new_generation(self, request_id: int) -> int:
        """Start a new generation (after a reset or rollback): frames of older ones are stale."""
        state = self._owned(request_id)
        state.generation += 1
        state.next_sequence = 0
        return state.generation

    def state(self, request_id: int) -> RequestState:
        """A copy of the request's state."""
        state = self._owned(request_id)
        return RequestState(
            state.request_id, state.temperature, state.generation, state.next_sequence
        )

    def owns(self, request_id: int) -> bool:
        """Whether this slot owns ``request_id``."""
        return request_id in self._requests

    def _owned(self, request_id: int) -> RequestState:
        try:
            return self._requests[request_id]
        except KeyError:
            raise ValueError(f"request {request_id} is not owned by slot {self.slot!r}") from None

    # ----- one round ------------------------------------------------------------------
    def check_header(self, header: FrameHeader, scheduled: set[int]) -> None:
        """Raise the receiver-side :class:`WireError` for a header, if any."""
        rid = header.request_id
        state = self._requests.get(rid)
        if state is None:
            raise NotOwnedError(
                f"frame for request {rid}: slot {self.slot!r} does not own it", request_id=rid
            )
        if rid not in scheduled:
            raise UnscheduledFrameError(
                f"frame for request {rid}: not scheduled in round {self._round}", request_id=rid
            )
        if header.generation != state.generation:
            error = (
                StaleGenerationError
                if header.generation < state.generation
                else FutureGenerationError
            )
            raise error(
                f"frame for request {rid}: generation {header.generation}, expected "
                f"{state.generation}",
                request_id=rid,
            )
        if header.sequence != state.next_sequence:
            seq_error = (
                StaleSequenceError if header.sequence < state.next_sequence else SequenceGapError
            )
            raise seq_error(
                f"frame for request {rid}: sequence {header.sequence}, expected "
                f"{state.next_sequence}",
                request_id=rid,
            )
        if (
            header.num_positions != self.num_positions
            or header.support_width > self.support_width
            or header.denominator != self.denominator
        ):
            raise FrameShapeError(
                f"frame for request {rid}: K = {header.num_positions}, S = "
                f"{header.support_width}, C = {header.denominator}; this receiver takes "
                f"K = {self.num_positions}, S <= {self.support_width}, C = {self.denominator}",
                request_id=rid,
            )
        if np.float32(header.temperature) != np.float32(state.temperature):
            raise TemperatureMismatchError(
                f"frame for request {rid}: temperature {header.temperature}, the verifier "
                f"has {state.temperature}",
                request_id=rid,
            )

    def receive_round(self, request_ids: Sequence[int], frames: Sequence[bytes]) -> RoundInputs:
        """Turn the frames that arrived for one round into selector inputs for ``request_ids``.

        Never raises for bad frames: each refused frame is logged and recorded, and its
        request (like any request with no accepted frame) falls back to K = 0. Raises
        ValueError only for a caller error (a scheduled request this slot does not own, or
        scheduled twice).
        """
        batch = len(request_ids)
        rows = {rid: b for b, rid in enumerate(request_ids)}
        if len(rows) != batch:
            raise ValueError(f"round {self._round}: request ids scheduled twice")
        states = [self._owned(rid) for rid in request_ids]
        round_index = self._round
        refusals: list[Refusal] = []

        def refuse(error: WireError, request_id: int | None) -> None:
            refusal = Refusal(round_index, request_id, error.reason, str(error))
            refusals.append(refusal)
            self.stats.frames_refused += 1
            self.stats.refused_by_reason[error.reason] += 1
            self.logger.warning(
                "slot %s round %d: refused frame for request %s (%s): %s",
                self.slot,
                round_index,
                "unknown" if request_id is None else request_id,
                error.reason,
                error,
            )

        decoded = decode_frames(
            list(frames),
            vocab_size=self.vocab_size,
            max_positions=self.num_positions,
            max_support=self.support_width,
        )
        self.stats.frames_received += len(frames)
        candidates: dict[int, list[int]] = {}
        first_reason: dict[int, str] = {}
        scheduled = set(rows)
        for i, (header, error) in enumerate(zip(decoded.headers, decoded.errors, strict=True)):
            if error is None and header is not None:
                try:
                    self.check_header(header, scheduled)
                except WireError as err:
                    error = err
            if error is not None:
                rid = error.request_id
                refuse(error, rid)
                if rid is not None and rid in rows:
                    first_reason.setdefault(rid, error.reason)
                continue
            if header is not None:
                candidates.setdefault(header.request_id, []).append(i)

        target = np.full(len(frames), -1, dtype=np.int64)
        for rid, indices in candidates.items():
            if len(indices) > 1:
                for _ in indices:
                    refuse(
                        DuplicateFrameError(
                            f"request {rid}: {len(indices)} valid frames in round "
                            f"{round_index}; refusing all of them",
                            request_id=rid,
                        ),
                        rid,
                    )
                first_reason.setdefault(rid, DuplicateFrameError.reason)
                continue
            target[indices[0]] = rows[rid]

        positions, support = self.num_positions, self.support_width
        draft_tokens = np.full((batch, positions), NO_TOKEN, dtype=np.int32)
        q_ids = np.full((batch, positions, support), NO_TOKEN, dtype=np.int32)
        q_counts = np.zeros((batch, positions, support), dtype=np.int32)
        decoded.scatter(target, draft_tokens, q_ids, q_counts)
        fallback = np.ones(batch, dtype=bool)
        fallback[target[target >= 0]] = False
        accepted = int((~fallback).sum())
        self.stats.frames_accepted += accepted
        self.stats.requests_verified += accepted

        for b in np.flatnonzero(fallback).tolist():
            rid = request_ids[b]
            reason = first_reason.get(rid, MISSING)
            message = (
                f"request {rid}: no frame arrived in round {round_index}"
                if reason == MISSING
                else f"request {rid}: its frame was refused ({reason})"
            )
            refusals.append(Refusal(round_index, rid, reason, message, fallback=True))
            self.stats.fallbacks += 1
            self.stats.fallback_by_reason[reason] += 1
            self.logger.warning(
                "slot %s round %d: request %d falls back to target-only verification (%s)",
                self.slot,
                round_index,
                rid,
                reason,
            )

        for state in states:
            state.next_sequence += 1
        temperature = np.array([s.temperature for s in states], dtype=np.float32)
        self.refusals.extend(refusals)
        self.stats.rounds += 1
        self._round += 1
        return RoundInputs(
            round_index=round_index,
            request_ids=list(request_ids),
            draft_tokens=draft_tokens,
            q_ids=q_ids,
            q_counts=q_counts,
            temperature=temperature,
            denominator=self.denominator,
            fallback=fallback,
            refusals=refusals,
        )
