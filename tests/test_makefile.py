"""`make PY=... lab` uses the Python it is given: a .venv made by another Python is made
again with PY (and make says so); the same PY, or no PY, keeps the .venv there. Run with
stand-in Pythons that only say who they are and make empty environments."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAKEFILE = ROOT / "Makefile"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

STAND_IN = """#!/bin/sh
# a stand-in Python: says who it is (as the Makefile asks) and makes an environment whose
# python logs what it is asked
case "$1" in
  -c) echo "$0 /prefix/of/$(basename "$0")" ;;
  -m) for last; do :; done
      mkdir -p "$last/bin"
      printf '#!/bin/sh\\necho "$@" >> "$(dirname "$0")/../log"\\n' > "$last/bin/python"
      chmod +x "$last/bin/python"
      echo "$0" > "$last/made-by" ;;
  *) exit 1 ;;
esac
"""


@pytest.fixture
def work(tmp_path):
    for name in ("py-a", "py-b"):
        p = tmp_path / name
        p.write_text(STAND_IN)
        p.chmod(0o755)
    return tmp_path


def make(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PY", "MAKEFLAGS", "MAKELEVEL")}
    return subprocess.run(
        ["make", "--no-print-directory", "-f", str(MAKEFILE), *args, ".venv/bin/python"],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def made_by(work: Path) -> str:
    return (work / ".venv" / "made-by").read_text().strip()


def test_a_given_py_makes_the_venv_again(work):
    a, b = work / "py-a", work / "py-b"
    p = make(work, f"PY={a}")
    assert p.returncode == 0, p.stderr
    assert made_by(work) == str(a)
    assert (work / ".venv" / ".python").read_text() == f"{a} /prefix/of/py-a\n"
    assert (work / ".venv" / "log").read_text() == "-m pip install -q --upgrade pip\n"
    (work / ".venv" / "mine").write_text("kept")

    # the same PY: the .venv there is kept
    p = make(work, f"PY={a}")
    assert p.returncode == 0, p.stderr
    assert "again" not in p.stdout and (work / ".venv" / "mine").exists()

    # no PY: kept as well, whichever Python made it
    p = make(work)
    assert p.returncode == 0, p.stderr
    assert "again" not in p.stdout and (work / ".venv" / "mine").exists()

    # another PY: made again with it, and make says so
    p = make(work, f"PY={b}")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == (
        f"make: PY={b} is {b} /prefix/of/py-b, but .venv was made by {a} /prefix/of/py-a: "
        "making .venv again with PY"
    )
    assert made_by(work) == str(b) and not (work / ".venv" / "mine").exists()


def test_a_venv_without_a_note_of_its_python_is_made_again_for_a_given_py(work):
    (work / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(work / "py-a", work / ".venv" / "bin" / "python")  # made before the note
    p = make(work, f"PY={work / 'py-b'}")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == (
        f"make: PY={work / 'py-b'} is {work / 'py-b'} /prefix/of/py-b, but .venv was made by "
        "another Python (it has no note of which): making .venv again with PY"
    )
    assert made_by(work) == str(work / "py-b")


def test_a_py_that_does_not_run_is_named(work):
    p = make(work, f"PY={work / 'no-such-python'}")
    assert p.returncode != 0
    assert f"make: PY={work / 'no-such-python'} does not run" in p.stderr
    assert not (work / ".venv").exists()
