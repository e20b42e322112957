"""benchmarks/results/: each file named by device and what it measures, never by the work
that made it, and every result file a document or a source names is there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FILES = sorted(p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md")

# A work step in a name: an issue number, a session step (-s3, -s4b), or a word that says
# which attempt it was rather than what it measures.
STEP = re.compile(
    r"issue|(?:^|[-_.])s\d+[a-z]?(?=[-_.])|[-_](?:final\d*|fast|slow|trims|noisy|latest|"
    r"first-hour|arch|new|old|rerun|fixed|tmp)\d*(?=[-_.])",
    re.IGNORECASE,
)
DEVICE = ("h100-", "h200-", "h200x2-", "cpu-", "chromium-")
# a result file as sources and documents name it: DEVICE-WHAT.json/.jsonl/.txt
NAMED = re.compile(r"\b(?:h100|h200x2|h200|cpu|chromium)-[\w.-]*?\.(?:jsonl|json|txt)\b")


def citing_files() -> list[Path]:
    globs = [
        "README.md",
        "docs/**/*.md",
        "benchmarks/*.md",
        "benchmarks/results/README.md",
        "benchmarks/**/*.py",
        "jupyter_gpumem/**/*.py",
        "tests/**/*.py",
        "scripts/**/*.py",
        "labextension/src/**/*.ts",
        "ui-tests/tests/**/*.ts",
        "Makefile",
    ]
    return sorted({p for g in globs for p in ROOT.glob(g) if p.is_file()})


def test_there_are_results():
    assert len(FILES) > 10


@pytest.mark.parametrize("name", FILES)
def test_a_result_is_named_by_device_and_what_it_measures(name):
    assert name.startswith(DEVICE), f"{name}: begin with the device ({', '.join(DEVICE)})"
    assert not STEP.search(name), f"{name}: a work step or an issue in the name"
    assert re.fullmatch(r"[a-z0-9.-]+", name), f"{name}: lower case, digits and '-' only"


@pytest.mark.parametrize("name", FILES)
def test_the_results_readme_describes_each_file(name):
    assert f"`{name}`" in (RESULTS / "README.md").read_text()


def test_every_result_file_named_anywhere_exists():
    missing = []
    for path in citing_files():
        text = path.read_text(errors="replace")
        names = set(NAMED.findall(text)) | set(
            re.findall(r"benchmarks/results/([\w.-]+\.(?:jsonl|json|txt))\b", text)
        )
        missing += [
            f"{path.relative_to(ROOT)}: {n}" for n in sorted(names) if not (RESULTS / n).exists()
        ]
    assert not missing, "result files named but not in benchmarks/results/:\n" + "\n".join(missing)
