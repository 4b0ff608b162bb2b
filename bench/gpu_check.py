"""One GPU session's worth of selector checks and timings (run on the device machine).

Checks the Triton selector against the torch reference at V = 129280 (T0 exact, T1 token
agreement), the Philox KAT on CUDA, CUDA-graph replay with new seeds/positions, then times
the selector against torch argmax in graphs of 10 rounds for a few plans. Prints a table last.
"""

from __future__ import annotations

import statistics
import sys

import pp3kernels as pk
import torch
from pp3kernels.philox import triton_philox_kat
from pp3kernels.selector import LaunchPlan, plan_launch, verify_chain

V = 129280
DEV = "cuda"


def make_case(batch: int, k: int, *, t0_share: float, q: str, gen: torch.Generator):
    logits = (torch.randn(batch, k + 1, V, generator=gen, device=DEV) * 4).to(torch.bfloat16)
    greedy = logits.float().argmax(-1).to(torch.int32)
    drafts = greedy[:, :k].clone()
    drafts[::3, k // 2] = (drafts[::3, k // 2] + 1) % V
    temp = torch.ones(batch, device=DEV)
    temp[: int(batch * t0_share)] = 0.0
    seed = torch.randint(0, 2**62, (batch,), generator=gen, device=DEV)
    pos = torch.randint(0, 2**40, (batch,), generator=gen, device=DEV)
    kw: dict[str, object] = {}
    C = 1 << 16
    if q == "point":
        ids, counts = pk.point_mass_q(drafts, C)
        kw = dict(q_ids=ids, q_counts=counts, denominator=C)
    elif q == "sparse":
        s = 64
        ids = torch.randint(0, V, (batch, k, s), generator=gen, device=DEV)
        ids[..., 0] = drafts
        ids = torch.sort(ids, dim=-1).values
        uniq = torch.ones_like(ids, dtype=torch.bool)
        uniq[..., 1:] = ids[..., 1:] != ids[..., :-1]
        counts = torch.where(uniq, 1, 0)
        total = counts.sum(-1, keepdim=True)
        counts = counts * (C // 128)
        first = torch.argmax(uniq.int(), dim=-1, keepdim=True)
        counts.scatter_add_(-1, first, (C - (total * (C // 128))).to(counts.dtype))
        ids = torch.where(uniq, ids, -1)
        kw = dict(q_ids=ids.to(torch.int32), q_counts=counts.to(torch.int32), denominator=C)
    else:
        qd = torch.softmax(logits.float() * 0.5, dim=-1)[:, :k].contiguous()
        qd.scatter_(-1, drafts.long()[..., None], 0.05, reduce="add")
        qd = qd / qd.sum(-1, keepdim=True)
        kw = dict(q_dense=qd)
    return logits, drafts, temp, seed, pos, kw


def check_against_reference() -> list[str]:
    gen = torch.Generator(device=DEV).manual_seed(7)
    lines = []
    for batch, k in [(1, 1), (4, 5), (64, 5), (3, 4)]:
        for q in ("point", "sparse", "dense"):
            logits, drafts, temp, seed, pos, kw = make_case(batch, k, t0_share=0.5, q=q, gen=gen)
            got = verify_chain(logits, drafts, temp, seed, pos, **kw)
            ref = pk.reference_verify_chain(logits, drafts, temp, seed, pos, **kw)
            t0 = temp == 0
            t0_ok = torch.equal(got.tokens[t0], ref.tokens[t0]) and torch.equal(
                got.accepted[t0], ref.accepted[t0]
            )
            same = (got.tokens == ref.tokens).all(1) & (got.status == ref.status)
            lines.append(
                f"ref B{batch}K{k} {q:6s}: T0 exact={t0_ok} rows equal {int(same.sum())}/{batch}"
                f" status_ok={(got.status == 0).all().item()}"
            )
            if not t0_ok:
                raise SystemExit("T0 mismatch against the reference: " + lines[-1])
    return lines


def check_graph_replay() -> str:
    gen = torch.Generator(device=DEV).manual_seed(11)
    logits, drafts, temp, seed, pos, kw = make_case(4, 5, t0_share=0.0, q="point", gen=gen)
    verify_chain(logits, drafts, temp, seed, pos, validate=False, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = verify_chain(logits, drafts, temp, seed, pos, validate=False, **kw)
    agree = 0
    for trial in range(5):
        seed.copy_(torch.randint(0, 2**62, (4,), generator=gen, device=DEV))
        pos.copy_(torch.randint(0, 2**40, (4,), generator=gen, device=DEV))
        graph.replay()
        eager = verify_chain(logits, drafts, temp, seed, pos, validate=False, **kw)
        agree += int(
            torch.equal(out.tokens, eager.tokens) and torch.equal(out.accepted, eager.accepted)
        )
    return f"graph replay with new seeds/positions equals eager: {agree}/5"


def time_graph(fn, rounds: int = 10, replays: int = 100) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(rounds):
            fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / rounds)
    return statistics.median(times)


def timings() -> list[str]:
    gen = torch.Generator(device=DEV).manual_seed(3)
    rows = ["case            plan(bb,bv,ns,w,bf)   selector_us  argmax_us  ratio"]
    for batch, k in [(1, 5), (4, 5), (64, 5)]:
        for share in (0.0, 1.0):
            logits, drafts, temp, seed, pos, kw = make_case(
                batch, k, t0_share=share, q="point", gen=gen
            )
            plans = [plan_launch(batch, k + 1, V, interpreter=False)]
            for nsplit, bv, bf, warps in [(32, 512, 1024, 8), (64, 256, 1024, 4)]:
                chunk = ((V + nsplit - 1) // nsplit + bf - 1) // bf * bf
                plans.append(LaunchPlan(1, bv, (V + chunk - 1) // chunk, chunk, warps, bf))
            argmax_us = time_graph(lambda: logits.argmax(-1))
            for plan in plans:
                sel = time_graph(
                    lambda plan=plan: verify_chain(
                        logits, drafts, temp, seed, pos, validate=False, plan=plan, **kw
                    )
                )
                rows.append(
                    f"B{batch}K{k} t0={share:.0f}  ({plan.block_b},{plan.block_v},{plan.nsplit},"
                    f"{plan.num_warps},{plan.block_f})  {sel:10.2f}  {argmax_us:9.2f}  {sel / argmax_us:5.2f}"
                )
    return rows


def main() -> int:
    print("torch", torch.__version__, "device", torch.cuda.get_device_name())
    if "timings" in sys.argv:
        print("\n".join(timings()))
        return 0
    kat = triton_philox_kat(DEV)
    print("philox KAT on CUDA:", "OK" if not kat else kat)
    for line in check_against_reference():
        print(line)
    print(check_graph_replay())
    table = timings()
    print("\n".join(table))
    return 0 if not kat else 1


if __name__ == "__main__":
    sys.exit(main())
