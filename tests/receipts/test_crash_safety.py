"""Crash safety of receipt writing: a real writer process is SIGKILLed at every step.

Steps (``pp3cli.receipts.write``): before anything, mid-receipt (half the temp file
written), after the receipt is stored but before its manifest line, mid-line (half the line
appended), after the line. Each time verify-receipts must report no FAIL (a receipt without
its line is ORPHAN), every earlier receipt must still be OK with its bytes and manifest
lines untouched, and the next writer must go on extending the same chain.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_verify_receipts import TOY, make_tree, report, statuses, toy_kind

from pp3cli.receipts.verify import FAIL, OK, ORPHAN, Result, verify_receipts
from pp3cli.receipts.write import MANIFEST_NAME, write_receipt

pytestmark = pytest.mark.usefixtures(toy_kind.__name__)

WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from pp3cli.receipts import write

    folder, tree, step = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    write.RECEIPT_KINDS = write.RECEIPT_KINDS | {"toy"}

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    real_write_all, calls = write._write_all, []

    def torn_write_all(fd, data):
        calls.append(len(data))
        if (step == "mid-receipt" and len(calls) == 1) or (step == "mid-line" and len(calls) == 2):
            real_write_all(fd, data[: len(data) // 2])
            os.fsync(fd)
            die()
        real_write_all(fd, data)

    write._write_all = torn_write_all
    if step == "before":
        write._store_receipt = lambda path, stored: die()
    if step == "after-receipt":
        write._append_line = lambda manifest, line: die()
    write.write_receipt(
        folder, "toy", parameters={"threshold": 5}, environment={}, data={"count": 1},
        verdict="PASS", root=tree, argv=["pp3", "toy"],
    )
    if step == "after-line":
        die()
    """
)
STEPS = ("before", "mid-receipt", "after-receipt", "mid-line", "after-line")


def honest(folder: Path, tree: Path, count: int) -> Path:
    return write_receipt(
        folder,
        TOY,
        parameters={"threshold": 5},
        environment={},
        data={"count": count},
        verdict="PASS" if count <= 5 else "FAIL",
        root=tree,
        argv=["pp3", "toy"],
    )


def no_fail(results: list[Result]) -> None:
    assert all(result.status != FAIL for result in results), report(results)


@pytest.mark.parametrize("step", STEPS)
def test_a_writer_killed_at_any_step_loses_nothing_and_fails_nothing(
    step: str, tmp_path: Path
) -> None:
    tree = make_tree(tmp_path / "tree")
    folder = tmp_path / "receipts"
    earlier = [honest(folder, tree, 3), honest(folder, tree, 9)]
    before = {path: path.read_bytes() for path in earlier}
    manifest = folder / MANIFEST_NAME
    manifest_before = manifest.read_bytes()

    child = subprocess.run(
        [sys.executable, "-c", WRITER, str(folder), str(tree), step],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stderr)

    results = verify_receipts(folder, root=tree)
    found = statuses(results)
    no_fail(results)
    assert all(found[path.name] == OK for path in earlier), report(results)
    assert all(path.read_bytes() == data for path, data in before.items())
    assert manifest.read_bytes().startswith(manifest_before)
    new = sorted(set(found) - {MANIFEST_NAME, *(path.name for path in earlier)})
    partials = [name for name in new if name.endswith(".partial")]
    receipts = [name for name in new if name.endswith(".json")]
    expected = {
        "before": ([], [], OK),
        "mid-receipt": ([ORPHAN], [], OK),
        "after-receipt": ([], [ORPHAN], OK),
        "mid-line": ([], [ORPHAN], ORPHAN),
        "after-line": ([], [OK], OK),
    }[step]
    assert [found[name] for name in partials] == expected[0], report(results)
    assert [found[name] for name in receipts] == expected[1], report(results)
    assert found[MANIFEST_NAME] == expected[2], report(results)
    if step == "mid-line":
        assert "torn last line" in report(results)

    # The next writer carries on the same chain; nothing earlier changes status.
    after = honest(folder, tree, 4)
    results = verify_receipts(folder, root=tree)
    found = statuses(results)
    no_fail(results)
    assert found[after.name] == OK and found[MANIFEST_NAME] == OK, report(results)
    assert all(found[path.name] == OK for path in earlier), report(results)
    assert [found[name] for name in receipts] == expected[1], report(results)
    lines = manifest.read_bytes().splitlines()
    assert lines[: len(manifest_before.splitlines())] == manifest_before.splitlines()
