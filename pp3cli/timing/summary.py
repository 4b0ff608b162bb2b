"""Probe numbers from raw samples: summaries, ratios, the check verdict, and recomputation.

Pure functions over plain data (numpy only), shared by ``pp3 probe`` when it writes a
receipt and by ``pp3 verify-receipts`` when it recomputes one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pp3cli.evidence.verdict import verdict_text
from pp3cli.timing.cases import NOMINAL_COPY_BANDWIDTH, ProbeCase, floor_us

SUMMARY_KEYS = ("n", "median", "p10", "p90", "min", "max")


def summarize(samples_us: Sequence[float]) -> dict[str, float]:
    """n, median, p10, p90, min, max of the per-call samples (numpy linear percentiles)."""
    if not samples_us:
        raise ValueError("no timing samples to summarise")
    values = np.asarray(samples_us, dtype=np.float64)
    p10, median, p90 = np.percentile(values, [10.0, 50.0, 90.0])
    return {
        "n": float(values.size),
        "median": float(median),
        "p10": float(p10),
        "p90": float(p90),
        "min": float(values.min()),
        "max": float(values.max()),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def case_ratios(medians: Mapping[str, float | None], floor: float) -> dict[str, float | None]:
    """selector/argmax, selector/vllm, selector/reference and selector/floor of the medians."""
    selector = medians.get("selector")
    return {
        "selector/argmax": ratio(selector, medians.get("argmax")),
        "selector/vllm": ratio(selector, medians.get("vllm")),
        "selector/reference": ratio(selector, medians.get("reference")),
        "selector/floor": ratio(selector, floor),
    }


def all_checks_passed(data: Mapping[str, Any]) -> bool:
    """True when every available comparator of every case passed every check."""
    for case in data.get("cases", []):
        for entry in case["comparators"].values():
            if entry.get("available") and not all(entry.get("checks", {}).values()):
                return False
            if entry.get("available") and not entry.get("checks"):
                return False
    return bool(data.get("cases"))


def verdict_of(data: Mapping[str, Any]) -> str:
    """PASS when every correctness check passed (speed targets are reported, not judged)."""
    return verdict_text(all_checks_passed(data))


def recompute_probe_data(data: Mapping[str, Any]) -> list[str]:
    """Problems found when recomputing a probe receipt's data; empty when it holds.

    Recomputes every summary from the stored raw samples, the copy bandwidth (2 x bytes /
    median, or the nominal one without a copy timing), every case's bytes read from its
    stored geometry and its floor from those, every ratio from the recomputed medians,
    ``checks_passed`` from the stored flags.
    """
    problems: list[str] = []

    def same(a: Any, b: Any) -> bool:
        if a is None or b is None:
            return a is None and b is None
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=1e-12)

    copy = data.get("copy")
    bandwidth = NOMINAL_COPY_BANDWIDTH
    if copy:
        summary = summarize(copy["times_us"])
        if any(not same(summary[k], copy["summary"].get(k)) for k in SUMMARY_KEYS):
            problems.append("copy: summary does not match the raw times")
        bandwidth = 2 * int(copy["bytes"]) / (summary["median"] * 1e-6)
        if not same(bandwidth, copy.get("bytes_per_s")):
            problems.append("copy: bytes_per_s does not match its bytes and median")
    if not same(bandwidth, data.get("copy_bandwidth_bytes_per_s")):
        problems.append("copy_bandwidth_bytes_per_s does not match the copy timing")
    for case in data.get("cases", []):
        name = case.get("name", "?")
        bytes_read = ProbeCase(**case["case"]).bytes_read()
        if bytes_read != case.get("bytes_read"):
            problems.append(f"{name}: bytes_read {case.get('bytes_read')} != {bytes_read}")
        if not same(floor_us(bytes_read, bandwidth), case.get("floor_us")):
            problems.append(f"{name}: floor_us does not match its bytes and the bandwidth")
        medians: dict[str, float | None] = {}
        for comparator, entry in case["comparators"].items():
            if not entry.get("available") or not entry.get("times_us"):
                medians[comparator] = None
                if entry.get("summary"):
                    problems.append(f"{name} {comparator}: summary without raw times")
                continue
            summary = summarize(entry["times_us"])
            stored = entry.get("summary") or {}
            for key in SUMMARY_KEYS:
                if not same(summary[key], stored.get(key)):
                    problems.append(
                        f"{name} {comparator}: {key} {stored.get(key)} != recomputed {summary[key]}"
                    )
            medians[comparator] = summary["median"]
        for key, value in case_ratios(medians, floor_us(bytes_read, bandwidth)).items():
            if not same(value, case["ratios"].get(key)):
                problems.append(f"{name}: ratio {key} does not match the medians")
    if bool(data.get("checks_passed")) != all_checks_passed(data):
        problems.append("checks_passed does not match the stored check flags")
    return problems


def recompute_probe(predicate: Mapping[str, Any]) -> str:
    """The verdict a probe receipt's raw data imply: FAIL if anything stored differs."""
    data = predicate["data"]
    return verdict_text(not recompute_probe_data(data) and all_checks_passed(data))


def median_or_none(entry: Mapping[str, Any]) -> float | None:
    """The stored median of a comparator entry, if timed."""
    summary = entry.get("summary")
    return float(summary["median"]) if summary else None
