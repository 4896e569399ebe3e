"""Tolerance comparisons of an output with an expected one (profiles, reports).

Profiles:

* ``exact`` — token ids: bitwise equality.
* ``float32`` / ``bfloat16`` — ``torch.testing.assert_close`` default
  tolerances for that dtype: ``|a - e| <= atol + rtol * |e|``.
* ``w8a8`` — the quantized model's documented tolerance (:data:`W8A8_ATOL`,
  :data:`W8A8_RTOL`, see ``docs/tolerance.md``).
* ``topk_logprob`` — logits/logprobs ``[..., vocab]``: per row, when the argmax
  tokens differ each side's token must be in the other's top-k (as vLLM's
  ``check_logprobs_close``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

# torch.testing.assert_close defaults (torch/testing/_comparison.py).
FLOAT32_RTOL = 1.3e-6
FLOAT32_ATOL = 1e-5
BFLOAT16_RTOL = 1.6e-2
BFLOAT16_ATOL = 1e-5
# W8A8 tolerance on last-token logits, measured (docs/tolerance.md; owned by the
# CPU-backend engineer): the CPU W8A8 emulation is bitwise batch-invariant
# (split / chunked / prefix-cached runs equal the unsplit run in 144 of 144
# measured cases), so W8A8-vs-W8A8 comparisons get the float32 allowance and no
# more. W8A8 vs float32 differs by up to 5.6 in logits: never a gate criterion.
W8A8_ATOL = FLOAT32_ATOL
W8A8_RTOL = FLOAT32_RTOL
# k of the top-k cross-containment check (vLLM's check_logprobs_close uses the
# number of logprobs requested; 5 is its common test setting).
TOPK_LOGPROB_K = 5
# How many offending rows/elements a mismatch report lists.
REPORT_EXAMPLES = 5


class GoldenMismatchError(AssertionError):
    """Value and golden differ beyond the profile's tolerance; the message is the report."""


@dataclass(frozen=True)
class ToleranceProfile:
    name: str
    kind: str  # "exact", "close" or "topk"
    atol: float = 0.0
    rtol: float = 0.0
    topk: int = 0

    def describe(self) -> str:
        if self.kind == "close":
            return f"{self.name} (atol={self.atol:g}, rtol={self.rtol:g})"
        if self.kind == "topk":
            return f"{self.name} (k={self.topk})"
        return self.name


PROFILES: Mapping[str, ToleranceProfile] = MappingProxyType(
    {
        "exact": ToleranceProfile("exact", "exact"),
        "float32": ToleranceProfile("float32", "close", FLOAT32_ATOL, FLOAT32_RTOL),
        "bfloat16": ToleranceProfile("bfloat16", "close", BFLOAT16_ATOL, BFLOAT16_RTOL),
        "w8a8": ToleranceProfile("w8a8", "close", W8A8_ATOL, W8A8_RTOL),
        "topk_logprob": ToleranceProfile("topk_logprob", "topk", topk=TOPK_LOGPROB_K),
    }
)


def get_profile(profile: str | ToleranceProfile) -> ToleranceProfile:
    if isinstance(profile, ToleranceProfile):
        return profile
    if profile not in PROFILES:
        raise ValueError(
            f"unknown tolerance profile {profile!r}; expected one of {tuple(PROFILES)}"
        )
    return PROFILES[profile]


def to_numpy(value: Any) -> np.ndarray:
    """numpy view of arrays, torch tensors (bfloat16 widened to float32) and lists."""
    if isinstance(value, np.ndarray):
        return value
    module = type(value).__module__
    if module.startswith("torch"):
        tensor = value.detach().cpu()
        if (
            not tensor.dtype.is_floating_point
            or tensor.dtype.itemsize >= np.dtype(np.float32).itemsize
        ):
            return tensor.numpy()
        return tensor.float().numpy()
    return np.asarray(value)


@dataclass
class Comparison:
    """Outcome of one comparison; ``report`` explains a failure."""

    ok: bool
    profile: str
    report: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    num_mismatched: int = 0
    num_total: int = 0
    details: dict[str, Any] = field(default_factory=dict)


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def _compare_exact(
    actual: np.ndarray, expected: np.ndarray, profile: ToleranceProfile
) -> Comparison:
    bad = actual != expected
    count = int(bad.sum())
    if count == 0:
        return Comparison(True, profile.name, num_total=actual.size)
    flat = np.flatnonzero(bad)
    examples = ", ".join(
        f"{_index(i, actual.shape)}: {actual.flat[i].item()!r} != {expected.flat[i].item()!r}"
        for i in flat[:REPORT_EXAMPLES]
    )
    report = f"{count} of {actual.size} elements differ (exact); first at {examples}"
    return Comparison(False, profile.name, report, num_mismatched=count, num_total=actual.size)


def _compare_close(
    actual: np.ndarray, expected: np.ndarray, profile: ToleranceProfile
) -> Comparison:
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    abs_err = np.abs(a - e)
    nan_mismatch = np.isnan(a) | np.isnan(e)
    abs_err = np.where(nan_mismatch, np.inf, abs_err)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_err = np.where(e != 0, abs_err / np.abs(e), np.where(abs_err == 0, 0.0, np.inf))
    rel_err = np.where(nan_mismatch, np.inf, rel_err)
    # NaN never matches (torch.testing's equal_nan=False default).
    exceed = nan_mismatch | (abs_err > profile.atol + profile.rtol * np.abs(e))
    count = int(exceed.sum())
    max_abs = float(abs_err.max()) if abs_err.size else 0.0
    max_rel = float(rel_err.max()) if rel_err.size else 0.0
    if count == 0:
        return Comparison(True, profile.name, "", max_abs, max_rel, 0, actual.size)
    where_abs = _index(int(abs_err.argmax()), actual.shape)
    where_rel = _index(int(rel_err.argmax()), actual.shape)
    first = np.flatnonzero(exceed)[:REPORT_EXAMPLES]
    examples = ", ".join(
        f"{_index(i, actual.shape)}: {a.flat[i]:.6g} vs {e.flat[i]:.6g}" for i in first
    )
    report = (
        f"{count} of {actual.size} elements exceed {profile.describe()}; "
        f"max abs error {max_abs:.6g} at {where_abs}, max rel error {max_rel:.6g} at {where_rel}; "
        f"first: {examples}"
    )
    return Comparison(False, profile.name, report, max_abs, max_rel, count, actual.size)


def _compare_topk(
    actual: np.ndarray, expected: np.ndarray, profile: ToleranceProfile
) -> Comparison:
    if actual.ndim == 0:
        raise ValueError("topk_logprob compares [..., vocab] logits or logprobs, got a scalar")
    vocab = actual.shape[-1]
    k = min(profile.topk, vocab)
    a_rows = actual.reshape(-1, vocab).astype(np.float64)
    e_rows = expected.reshape(-1, vocab).astype(np.float64)
    a_top = np.argsort(-a_rows, axis=1, kind="stable")[:, :k]
    e_top = np.argsort(-e_rows, axis=1, kind="stable")[:, :k]
    failures = []
    for row in range(a_rows.shape[0]):
        a_tok, e_tok = int(a_top[row, 0]), int(e_top[row, 0])
        if a_tok != e_tok and (a_tok not in e_top[row] or e_tok not in a_top[row]):
            failures.append(f"row {row}: token {a_tok} vs golden {e_tok}")
    if not failures:
        return Comparison(True, profile.name, num_total=a_rows.shape[0])
    report = (
        f"{len(failures)} of {a_rows.shape[0]} rows fail {profile.describe()} "
        f"(argmax tokens not in each other's top-{k}): {'; '.join(failures[:REPORT_EXAMPLES])}"
    )
    return Comparison(
        False, profile.name, report, num_mismatched=len(failures), num_total=a_rows.shape[0]
    )


_COMPARATORS: Mapping[str, Callable[[np.ndarray, np.ndarray, ToleranceProfile], Comparison]] = (
    MappingProxyType({"exact": _compare_exact, "close": _compare_close, "topk": _compare_topk})
)


def compare(actual: Any, expected: Any, profile: str | ToleranceProfile = "float32") -> Comparison:
    """Compare ``actual`` with ``expected`` under ``profile`` (never raises on a mismatch)."""
    prof = get_profile(profile)
    a, e = to_numpy(actual), to_numpy(expected)
    if a.shape != e.shape:
        return Comparison(
            False, prof.name, f"shape {a.shape} != expected shape {e.shape}", num_total=a.size
        )
    return _COMPARATORS[prof.kind](a, e, prof)


def assert_matches(
    actual: Any, expected: Any, profile: str | ToleranceProfile = "float32"
) -> Comparison:
    """:func:`compare` that raises :class:`GoldenMismatchError` with the report."""
    result = compare(actual, expected, profile)
    if not result.ok:
        raise GoldenMismatchError(result.report)
    return result

