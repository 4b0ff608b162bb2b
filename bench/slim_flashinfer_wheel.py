"""Repack FlashInfer's official wheel without the CUDA sources its sampling module never
compiles, so that it fits the GPU machine's 64 MiB per-call transfer with pp3's tree.

    python bench/slim_flashinfer_wheel.py OFFICIAL.whl OUT_DIR

Keeps every Python file, ``data/include``, ``data/cccl`` and the five ``data/csrc`` files
that ``flashinfer.jit.sampling.gen_sampling_module`` compiles or includes (sampling.cu,
renorm.cu, flashinfer_sampling_binding.cu, sampling_utils.h, tvm_ffi_utils.h: the
transitive ``#include`` closure was computed from the wheel, 0.7.2.post1); drops the other
``data/csrc`` sources and ``data/cutlass`` (included by no sampling file). Kept files are
byte-identical; RECORD lists exactly the kept files. Prints the official and slim SHA-256.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

KEEP_CSRC = {
    "sampling.cu",
    "renorm.cu",
    "flashinfer_sampling_binding.cu",
    "sampling_utils.h",
    "tvm_ffi_utils.h",
}


def dropped(name: str) -> bool:
    """True for a wheel member the sampling module never needs."""
    if name.startswith("flashinfer/data/cutlass/"):
        return True
    prefix = "flashinfer/data/csrc/"
    return name.startswith(prefix) and name[len(prefix) :] not in KEEP_CSRC


def main(official: Path, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / official.name
    with (
        zipfile.ZipFile(official) as source,
        zipfile.ZipFile(target, "x", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as slim,
    ):
        record_name = next(n for n in source.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for info in source.infolist():
            if info.filename == record_name or dropped(info.filename):
                continue
            data = source.read(info)
            slim.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            rows.append(f"{info.filename},sha256={digest.decode()},{len(data)}")
        rows.append(f"{record_name},,")
        slim.writestr(record_name, "\n".join(rows) + "\n")
    for path in (official, target):
        file_digest = hashlib.sha256(path.read_bytes()).hexdigest()
        print(f"{file_digest}  {path}  {path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
