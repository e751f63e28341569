"""What every part of the benchmark report shares: number formats, Markdown tables, the Target a
verdict is written as, and the marked sections of docs/benchmarks.md that one script can replace alone."""

from __future__ import annotations

import datetime
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    """One promise, what was measured, and whether it held ("pass", "miss", or why it was not judged)."""

    promise: str
    rule: str
    measured: str
    status: str
    spread: float = 1.0  # largest max/min ratio among the rounds the verdict rests on


NOISY_SPREAD = 1.5
#: The engine's target: a 3-policy tier decision >= this times one bare EVALSHA, sync and async.
ENGINE_TARGET = 0.9


def spread(*samples: tuple[float, ...]) -> float:
    spreads = [max(s) / min(s) for s in samples if s and min(s) > 0]
    return max(spreads, default=1.0)


# -- formatting ------------------------------------------------------------------------------------
def num(value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:,.0f}"


def usec(seconds: float) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds * 1e6:,.0f}"


def signed_usec(seconds: float) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds * 1e6:+,.0f} µs"


def msec(seconds: float) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.1f}"


def times(ratio: float) -> str:
    return "n/a" if ratio is None or math.isnan(ratio) else f"{ratio:.2f}x"


def size(value: float) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:,.0f}" if value < 10_000 else f"{value / 1024:,.1f} KiB"


def table(header: list[str], rows: list[list[str]], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    marks = [":---" if a == "l" else "---:" for a in align]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(marks) + " |",
            *("| " + " | ".join(row) + " |" for row in rows), ""]

def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def median_ratio(samples: tuple[float, ...], floors: tuple[float, ...]) -> float:
    """The median of the per-round ratios of two interleaved series (a second, paired view of their ratio)."""
    return median([a / b for a, b in zip(samples, floors, strict=True) if b > 0]) if samples else math.nan



def first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def targets_table(targets: list[Target]) -> list[str]:
    status_mark = {"pass": "**pass**", "miss": "**MISS**"}
    return table(["target", "how it is judged", "measured", "result"],
                  [[t.promise, t.rule, t.measured, status_mark.get(t.status, t.status)
                    + (f" (noisy: rounds {t.spread:.1f}x apart)" if t.spread > NOISY_SPREAD else "")]
                   for t in targets], "llll")



#: The repository root (the scripts' sections go into its docs/benchmarks.md).
ROOT = Path(__file__).resolve().parent.parent

#: Sections of benchmarks.md written by other benchmark scripts (bench/concurrency_bench.py --write,
#: bench/gateway_bench.py --write), each between its markers: kept when this report is written again.
KEPT_START = "<!-- section: "
KEPT_END = "<!-- end of section -->"


def kept_sections(text: str, written: str = "") -> str:
    """The marked sections of an existing benchmarks.md that the new document `written` does not have
    itself, in order ("" when there are none)."""
    sections = []
    for part in text.split(KEPT_START)[1:]:
        body, found, _ = part.partition(KEPT_END)
        if found and KEPT_START + body.partition("\n")[0] not in written:
            sections.append(KEPT_START + body + KEPT_END + "\n")
    return "\n".join(sections)


def marked_section(name: str, section: str) -> str:
    """`section` between the markers of the section `name` (which replace_section finds again)."""
    return f"{KEPT_START}{name} -->\n{section.rstrip()}\n{KEPT_END}\n"


def replace_section(text: str, name: str, section: str) -> str:
    """`text` (benchmarks.md) with the marked section `name` replaced by `section` (appended if absent)."""
    start = f"{KEPT_START}{name} -->"
    block = marked_section(name, section)
    if start in text:
        before, _, rest = text.partition(start)
        _, _, after = rest.partition(KEPT_END + "\n")
        return before + block + after
    return text.rstrip("\n") + "\n\n" + block if text.strip() else block


def write_script_section(name: str, title: str, script: str, intro: list[str], lines: list[str],
                         load_at_start: float, load_at_end: float) -> None:
    """Put the results `lines` of another benchmark script (`script`, run with --write) into
    docs/benchmarks.md as the marked section `name` under `title`, after `intro`, with when, at which
    commit and at which load it ran (`write` keeps the section when it writes the rest)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join([
        title, "",
        f"Written by `python3 {script} --write` (not by `bench/run.py`, which keeps this section).",
        *intro, "",
        f"This run: {when}, commit {commit.stdout.strip() or '?'}, load average (1 min) at start / end "
        f"{load_at_start:.2f} / {load_at_end:.2f}.",
        "",
        *lines,
    ])
    path = ROOT / "docs" / "benchmarks.md"
    path.write_text(replace_section(path.read_text(encoding="utf-8"), name, section), encoding="utf-8")


