"""The repository describes the software as it is: no tracked file refers to numbered
development runs or carries a dated experiment log (git history keeps those), and the
generated performance tables match their results files."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_ORDINALS = ("eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|"
             "twentieth|thirtieth|fortieth|fiftieth|sixtieth")
_UNITS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth"
_TENS = "twenty|thirty|forty|fifty|sixty"

# A run named by its number or its ordinal; each pattern is written so that it does not match itself.
_RUN = "ses" + "sion"  # the noun a development run goes by, assembled so no tracked line spells it
HISTORY = [
    re.compile(rf"\b{_RUN}s?[ _-]?\d+", re.I),  # a numbered run, a range of them, or a file named after one
    re.compile(rf"\b(?:{_ORDINALS})(?:'s|’s|\s+(?:{_RUN}|run)s?)\b", re.I),
    re.compile(rf"\b(?:{_TENS})-(?:{_UNITS})(?:'s|’s|\s+(?:{_RUN}|run)s?)\b", re.I),
    re.compile(rf"\b(?:{_UNITS}|tenth)\s+{_RUN}\b", re.I),
    re.compile(r"\bruns? \d+(?:[-–]\d+)? of\b", re.I),  # "the n-th run of an A/B file"
]

# A before/after timing (a number, an arrow, a number and a unit of time): the log of an
# experiment, not a fact about the code.
TIMING_LOG = re.compile(r"\d+(?:\.\d+)?\s*(?:->|→)\s*\d+(?:\.\d+)?\s*(?:us|µs|ms)\b")

# A calendar date belongs to a results file (docs/bench/<device>.json) or to a block that
# tools/perf_tables.py generates from one; anywhere else it dates an experiment log.
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
GENERATED = re.compile(r"<!-- perf_tables: begin .*?<!-- perf_tables: end -->", re.S)


def _tracked_text_files():
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in names.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        yield name, data.decode("utf-8", errors="replace")


def history_references(text: str) -> list[str]:
    return [m.group(0) for pattern in [*HISTORY, TIMING_LOG] for m in pattern.finditer(text)]


def dated_lines(name: str, text: str) -> list[str]:
    if name.startswith("docs/bench/") and name.endswith(".json"):
        return []
    return [m.group(0) for m in DATE.finditer(GENERATED.sub("", text))]


def _in_git_checkout() -> bool:
    return subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode == 0


needs_git = pytest.mark.skipif(not _in_git_checkout(), reason="needs the git checkout (git ls-files)")


def test_history_patterns_catch_run_references_and_not_ordinary_words():
    # The phrases are assembled here so that this file itself stays clean.
    s = "ses" + "sion"
    hits = [f"{s} 12 measured", f"{s.title()} 8 (2026)", f"{s}s 11-40", f"{s}s 23–27", f"docs/bench/x-{s}32-final.json",
            "from the thirty-" + "second's", "the fortie" + "th " + s + "'s run", "the eleven" + "th's",
            "ru" + "n 3 of the A/B file", "the first " + s, "bias bf16 27.4 -" + "> 25.1 us", "0.2057 " + "→ 0.2002 ms"]
    for text in hits:
        assert history_references(text), text
    misses = ["a second sample", "the first's shape", "runs of 4 cells", "run 3 times", "the thread's second",
              "cudaStreamCaptureModeGlobal", s + "less", "the 32nd bit", "one run of the benchmark",
              "k=2 -> 16 float32", "x -> output"]
    for text in misses:
        assert not history_references(text), text
    assert dated_lines("src.py", "measured 20" + "26-11-25: 1.2 ms") and not dated_lines("src.py", "torch 2.11.0")
    assert not dated_lines("docs/bench/h100.json", '"date": "20' + '26-11-27"')


@needs_git
def test_no_tracked_file_refers_to_development_runs():
    found = {name: refs for name, text in _tracked_text_files() if (refs := history_references(text))}
    assert not found, found


@needs_git
def test_no_tracked_file_carries_a_dated_log():
    found = {name: dates for name, text in _tracked_text_files() if (dates := dated_lines(name, text))}
    assert not found, found


def test_generated_performance_tables_match_their_results_files():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "perf_tables.py"), "--check"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_docs_link_only_files_inside_the_repository():
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)", doc.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path = (doc.parent / target).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), (doc.name, target)
