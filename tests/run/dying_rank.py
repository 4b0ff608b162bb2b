"""pp3's entry point with a planted death: one rank exits mid-run (tests of a rank's death).

``PP3_TEST_DYING_RANK`` names the rank that dies; it dies when its first family share is
done, just before the first exchange with the other ranks, after writing the time of its
death to ``PP3_TEST_DEATH_FILE``. Run as a script (``torchrun ... dying_rank.py ARGS``) or
as a module with this folder on PYTHONPATH (``pp3cli.run.ranks.launch(module=...)``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pp3cli.cli.app import main
from pp3cli.evidence import shares

_merge = shares.RankShare.merge


def _dying_merge(
    self: shares.RankShare, laws: Sequence[Any], counts: Mapping[str, Any]
) -> dict[str, Any]:
    if self.rank == int(os.environ["PP3_TEST_DYING_RANK"]):
        Path(os.environ["PP3_TEST_DEATH_FILE"]).write_text(repr(time.time()))
        os._exit(17)
    return _merge(self, laws, counts)


shares.RankShare.merge = _dying_merge  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
