"""The jupyter_server extension puts our message types into untracked_message_types and
into JupyterLab's page config (so panel requests don't flip the busy indicator)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path


def test_enabling_config_names_the_extension():
    cfg = json.loads(
        (Path(__file__).parents[1] / "jupyter-config/server-config/jupyter_gpumem.json").read_text()
    )
    assert cfg == {"ServerApp": {"jpserver_extensions": {"jupyter_gpumem": True}}}


def test_server_and_page_config_untrack_our_messages(tmp_path):
    script = textwrap.dedent(
        """
        import json
        from jupyter_server.serverapp import ServerApp
        app = ServerApp(jpserver_extensions={"jupyter_gpumem": True, "jupyterlab": True})
        app.initialize(["--no-browser", "--allow-root", "--port=0",
                        f"--ServerApp.root_dir={ROOT!r}"], find_extensions=False)
        km = app.kernel_manager
        page = app.web_app.settings.get("page_config_data", {})
        print(json.dumps({"km": list(km.untracked_message_types),
                          "page": page.get("untracked_message_types"),
                          "tracks": km.track_message_type("gpumem_request")}))
        """
    ).replace("ROOT", repr(str(tmp_path)))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("gpumem_request", "gpumem_reply"):
        assert name in r["km"] and name in r["page"]
    assert "kernel_info_request" in r["km"]  # the defaults stay
    assert r["tracks"] is False
    assert re.search("jupyter_gpumem", out.stderr)
