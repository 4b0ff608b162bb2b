"""Exit 1 naming any of the given modules that this interpreter could import (else 0).

`make review` runs it in the reviewer's venv to prove that torch and triton are absent, so
that the `pp3 verify-receipts` run after it shows that verifying needs neither.
"""

import importlib.util
import sys

present = [name for name in sys.argv[1:] if importlib.util.find_spec(name) is not None]
if present:
    sys.exit(f"expected these modules to be absent, but they import: {', '.join(present)}")
print(f"absent as required: {', '.join(sys.argv[1:])}")
