"""No quiet loss of profiles: how many instrumented cases came back with one (issue 45).

Each case's absent ``evidence.profile`` is honest on its own, but a session whose
every instrumented case lost its traces still passed, and nothing said so. This
counts, over the results a session wrote, the instrumented cases (those whose
result carries an ``evidence.profile`` field, present or absent) and those with
a profile. The count is the first verdict line ("profiles: k of n instrumented
cases", with the most common absent reason), a ``profiles`` block of
``summary.json`` and a line of the report. Under ``--afd-profile`` a session in
which no instrumented case has a profile fails; a partial loss is a warning that
names the cases.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SUMMARY_KEY = "profiles"
ENTRY_KEY = "profile"  # per written result, in summary.json's "results" and the terminal rows
MAX_NAMED_CASES = 5


def status_of(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """A result's profile status (None: the case was not instrumented)."""
    profile = doc.get("evidence", {}).get("profile")
    if profile is None:
        return None
    absent = isinstance(profile, Mapping) and "absent_reason" in profile and \
        profile.get("value", None) is None
    return {"present": not absent,
            "absent_reason": str(profile["absent_reason"]) if absent else None}


@dataclass
class ProfileCount:
    """The instrumented cases of a session, and which of them lost their profile (and why)."""

    with_profile: list[str] = field(default_factory=list)
    lost: dict[str, str] = field(default_factory=dict)  # case id -> absent reason

    @classmethod
    def of(cls, cases: Iterable[tuple[str, Mapping[str, Any] | None]]) -> ProfileCount:
        """From (case id, :func:`status_of`) pairs."""
        count = cls()
        for case_id, status in cases:
            if status is None:
                continue
            if status["present"]:
                count.with_profile.append(case_id)
            else:
                count.lost[case_id] = status["absent_reason"]
        return count

    @property
    def instrumented(self) -> int:
        return len(self.with_profile) + len(self.lost)

    def most_common_reason(self) -> tuple[str, int] | None:
        if not self.lost:
            return None
        return Counter(self.lost.values()).most_common(1)[0]

    def fails(self, requested: bool) -> bool:
        """``--afd-profile`` asked for profiles and not one instrumented case has one."""
        return requested and self.instrumented > 0 and not self.with_profile

    def line(self, requested: bool) -> str:
        """``profiles: k of n instrumented cases`` and, on a loss, its most common reason."""
        text = f"profiles: {len(self.with_profile)} of {self.instrumented} instrumented cases"
        common = self.most_common_reason()
        if common is not None:
            reason, cases = common
            text += f"; most common reason ({cases} of {len(self.lost)} lost): {reason}"
        if self.fails(requested):
            text += "; --afd-profile: no profile came back, failing the session"
        return text

    def warning(self) -> str | None:
        """A partial loss, naming the cases (None: no loss, or a total one, which fails)."""
        if not self.lost or not self.with_profile:
            return None
        names = sorted(self.lost)
        shown = ", ".join(names[:MAX_NAMED_CASES])
        more = f" and {len(names) - MAX_NAMED_CASES} more" if len(names) > MAX_NAMED_CASES else ""
        return f"{len(names)} instrumented case(s) have no profile: {shown}{more}"

    def summary(self, requested: bool) -> dict[str, Any]:
        """The ``summary.json`` block."""
        common = self.most_common_reason()
        return {
            "requested": requested,
            "instrumented_cases": self.instrumented,
            "cases_with_profile": len(self.with_profile),
            "most_common_reason": None if common is None else common[0],
            "fails_session": self.fails(requested),
            "lost": [{"case_id": case, "absent_reason": reason}
                     for case, reason in sorted(self.lost.items())],
        }


def count_entries(entries: Iterable[Mapping[str, Any]]) -> ProfileCount:
    """From the session's written-result rows (``summary_entry``)."""
    return ProfileCount.of((e["case_id"], e.get(ENTRY_KEY)) for e in entries)


def count_docs(docs: Iterable[Mapping[str, Any]]) -> ProfileCount:
    """From result documents (the report)."""
    return ProfileCount.of((d["case_id"], status_of(d)) for d in docs)
