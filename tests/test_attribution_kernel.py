"""Frame -> cell mapping through a real ipykernel (jupyter_client), without a GPU.

ipykernel compiles each cell under a file named after a hash of its code; frames recorded
while a cell runs must read as ``In[N] line L`` with the cell's own count (the latest one
when the same code ran again), the per-cell attribution must pick the cell's own line,
and library frames must stay beside the user frame.
"""

from __future__ import annotations

import json

import pytest

from tests.test_kernel_protocol import start_kernel, wait_execute

pytestmark = pytest.mark.kernel

FRAMES = (
    "import sys, json\n"
    "def frames():\n"
    "    f = sys._getframe()\n"
    "    out = []\n"
    "    while f is not None:\n"
    "        out.append({'filename': f.f_code.co_filename, 'line': f.f_lineno,"
    " 'name': f.f_code.co_name})\n"
    "        f = f.f_back\n"
    "    return out\n"
)

RESOLVE = (
    "from jupyter_gpumem.analysis.sites import SiteResolver\n"
    "from jupyter_gpumem.analysis.cell_sites import cell_attribution\n"
    "from jupyter_gpumem._ipython.cells import IPythonCells\n"
    "from jupyter_gpumem.model import AllocatorSnapshot\n"
    "cells = IPythonCells(get_ipython())\n"
    "r = SiteResolver(cells)\n"
    "def block(address, fr):\n"
    "    return {'address': address, 'size': 1024, 'requested_size': 1000,"
    " 'state': 'active_allocated', 'frames': fr}\n"
    "snap = AllocatorSnapshot(0.0, [{'device': 0, 'address': 0, 'total_size': 4096,"
    " 'blocks': [block(0, fr), block(1024, fr2), block(2048, []), block(3072, old)]}], True)\n"
    "att = cell_attribution(snap, 0, cells.files_of(COUNT), {3072: 1024}, r)\n"
    "print(json.dumps({'site': r.site(fr).label, 'text': r.site(fr).text,"
    " 'caller': r.site(fr[1:]).label, 'lib': r.site(fr2).library,"
    " 'lib_site': r.site(fr2).label, 'lines': [[s.line, s.bytes, s.text] for s in att.lines],"
    " 'no_stack': att.no_stack, 'new': att.new_bytes}))\n"
)


@pytest.fixture(scope="module")
def kernel():
    km, kc = start_kernel({})
    wait_execute(kc, "%load_ext jupyter_gpumem")
    yield kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def output(kc, code):
    """Run code; return its stdout (the last line) and the execute_reply."""
    msg_id = kc.execute(code)
    out = []
    while True:
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        if msg["msg_type"] == "error":
            raise AssertionError("\n".join(msg["content"]["traceback"]))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=30)
    return "".join(out).strip().splitlines()[-1:] or [""], reply


def test_frames_read_as_cells_and_lines(kernel):
    kc = kernel
    defined = wait_execute(kc, FRAMES)["content"]["execution_count"]
    ran = wait_execute(
        kc,
        "x = 1\nfr = frames()\nimport json as _j\n"
        "fr2 = [{'filename': _j.__file__, 'line': 1, 'name': 'dumps'}] + fr",
    )
    count = ran["content"]["execution_count"]
    wait_execute(kc, "old = fr")
    (line,), _ = output(kc, RESOLVE.replace("COUNT", str(count)))
    got = json.loads(line)
    # inside frames(), in the cell defining it (its frame was read on line 6)
    assert got["site"] == f"In[{defined}] line 6"
    assert got["text"].startswith("out.append({'filename': f.f_code.co_filename")
    assert got["caller"] == f"In[{count}] line 2"
    assert got["lib_site"] == f"In[{defined}] line 6"  # json's frame is a library frame
    assert got["lib"].endswith("json/__init__.py:1 dumps")
    # per cell: the cell's own line, once per new block; the old block is not counted
    assert got["lines"] == [[2, 2048, "fr = frames()"]]
    assert got["no_stack"] == 1024 and got["new"] == 3072


def test_the_same_code_run_again_maps_to_its_latest_count(kernel):
    kc = kernel
    wait_execute(kc, FRAMES)
    code = "y = 2\nfr = frames()\nfr2 = fr\nold = []"
    first = wait_execute(kc, code)["content"]["execution_count"]
    again = wait_execute(kc, code)["content"]["execution_count"]
    assert again > first
    (line,), _ = output(kc, RESOLVE.replace("COUNT", str(again)))
    assert json.loads(line)["caller"] == f"In[{again}] line 2"
