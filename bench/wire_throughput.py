"""Draft-frame throughput: frames/s to encode, decode+validate, and both, at B=64 K=5 S=64.

Every frame carries a full support of S = 64 ids per position (2652 bytes); decoding
includes CRC32C, every validation check and the scatter into the [B, K, S] selector
inputs (``DraftReceiver.receive_round``, the path a verifier runs). Prints one line per
measurement (median of repeats) and the layout version.

Usage: python bench/wire_throughput.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from pp3cli.wire import frames as wire
from pp3cli.wire.receiver import DraftReceiver

B, K, S, V, C = 64, 5, 64, 129280, 1 << 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    ids = np.stack([np.stack([rng.choice(V, S, replace=False) for _ in range(K)])
                    for _ in range(B)]).astype(np.int32)  # fmt: skip
    counts = np.full((B, K, S), C // S, dtype=np.int32)
    drafts = ids[:, :, 0].copy()
    temperature = np.where(np.arange(B) % 2 == 0, 0.0, 1.0).astype(np.float32)
    request_ids = np.arange(B, dtype=np.uint64)

    def encode(sequence: int) -> list[bytes]:
        return wire.encode_frames(
            drafts, ids, counts, denominator=C, temperature=temperature,
            request_ids=request_ids, generation=0, sequence=sequence,
        )  # fmt: skip

    receiver = DraftReceiver(
        slot="bench", vocab_size=V, num_positions=K, support_width=S, denominator=C
    )
    for rid, temp in zip(request_ids.tolist(), temperature.tolist(), strict=True):
        receiver.admit(int(rid), temperature=temp)
    rids = [int(r) for r in request_ids.tolist()]
    sequence = 0

    def timed(fn: Callable[[], object]) -> float:
        rates: list[float] = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for _ in range(args.iterations):
                fn()
            rates.append(B * args.iterations / (time.perf_counter() - start))
        return statistics.median(rates)

    frames = encode(0)
    encode_rate = timed(lambda: encode(0))

    def decode() -> None:
        nonlocal sequence
        batch = frames_by_seq[sequence]
        inputs = receiver.receive_round(rids, batch)
        if inputs.fallback.any():
            raise SystemExit(f"unexpected fallback: {inputs.refusals[:1]}")
        sequence += 1

    total = args.repeats * args.iterations
    frames_by_seq = [encode(s) for s in range(2 * total + 1)]
    decode_rate = timed(decode)

    def both() -> None:
        nonlocal sequence
        inputs = receiver.receive_round(rids, encode(sequence))
        if inputs.fallback.any():
            raise SystemExit("unexpected fallback")
        sequence += 1

    both_rate = timed(both)
    print(f"layout version {wire.VERSION}; B={B} K={K} S={S} V={V}; frame {len(frames[0])} bytes")
    print(f"encode:                 {encode_rate:10.0f} frames/s")
    print(f"decode+validate+scatter:{decode_rate:10.0f} frames/s")
    print(f"round trip:             {both_rate:10.0f} frames/s")


if __name__ == "__main__":
    main()
