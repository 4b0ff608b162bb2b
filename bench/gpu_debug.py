"""Diagnose the selector on the GPU: compile every launch shape, compare plans and references."""

import io
import sys
import traceback
from contextlib import redirect_stderr

import pp3kernels as pk
import torch
from pp3kernels.selector import LaunchPlan, plan_launch, verify_chain

V, K = 129280, 5


def inputs(batch, vocab, gen):
    logits = (torch.randn(batch, K + 1, vocab, generator=gen, device="cuda") * 4).to(torch.bfloat16)
    greedy = logits.float().argmax(-1).to(torch.int32)
    drafts = greedy[:, :K].clone()
    drafts[::3, K // 2] = (drafts[::3, K // 2] + 1) % vocab
    temp = torch.ones(batch, device="cuda")
    temp[::4] = 0.0
    seed = torch.randint(0, 2**62, (batch,), generator=gen, device="cuda")
    pos = torch.randint(0, 2**40, (batch,), generator=gen, device="cuda")
    ids, counts = pk.point_mass_q(drafts, 1 << 16)
    return logits, drafts, temp, seed, pos, dict(q_ids=ids, q_counts=counts, denominator=1 << 16)


def try_plan(name, args, kw, plan):
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            out = verify_chain(*args, plan=plan, **kw)
            torch.cuda.synchronize()
        return out
    except Exception as exc:  # report the compiler's own error lines
        lines = [ln for ln in err.getvalue().splitlines() if "error" in ln.lower()][:6]
        print(f"  COMPILE/RUN FAIL {name} {plan}: {type(exc).__name__}: {str(exc)[:200]}")
        for ln in lines:
            print("     ", ln[:300])
        traceback.print_exc(limit=1, file=sys.stdout)
        return None


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(7)
    small = inputs(4096, 16, gen)
    print("small-V plan", plan_launch(4096, K + 1, 16, interpreter=False))
    o = try_plan("smallV", small[:5], small[5], None)
    if o is not None:
        r = pk.reference_verify_chain(*[t.cpu() for t in small[:5]],
                                      **{k: v.cpu() if torch.is_tensor(v) else v for k, v in small[5].items()})
        print("  smallV equal rows vs ref_cpu:", (o.tokens.cpu() == r.tokens).all(1).sum().item(), "/ 4096")
    for batch in (64, 4):
        args = inputs(batch, V, gen)
        plans = {
            "default": plan_launch(batch, K + 1, V, interpreter=False),
            "single": LaunchPlan(1, 512, 1, 131072, 8, 4096),
            "split64": LaunchPlan(1, 256, 64, 2048, 4, 1024),
            "rowtile": LaunchPlan(2, 256, 1, 131072, 8, 1024),
        }
        outs = {}
        for name, plan in plans.items():
            o = try_plan(name, args[:5], args[5], plan)
            if o is not None:
                outs[name] = o
        if "default" in outs:
            outs["default_again"] = verify_chain(*args[:5], plan=plans["default"], **args[5])
        outs["ref_cuda"] = pk.reference_verify_chain(*args[:5], **args[5])
        outs["ref_cpu"] = pk.reference_verify_chain(
            *[t.cpu() for t in args[:5]], **{k: v.cpu() if torch.is_tensor(v) else v for k, v in args[5].items()}
        )
        names = list(outs)
        print(f"B={batch} default {plans['default']}")
        for i, a in enumerate(names):
            row = [f"{b}:{(outs[a].tokens.cpu() == outs[b].tokens.cpu()).all(1).sum().item()}" for b in names[i + 1:]]
            print(f"  {a:14s} equal rows vs " + " ".join(row))
        ref = outs["ref_cpu"]
        got = outs.get("default")
        if got is not None:
            bad = (ref.tokens != got.tokens.cpu()).any(1).nonzero().flatten()[:3].tolist()
            for b in bad:
                print("  row", b, "kernel", got.tokens[b].tolist(), "| ref", ref.tokens[b].tolist())


if __name__ == "__main__":
    main()
