"""Each picture (segment map, history plot, scan chart, timeline) as inline SVG for trusted
HTML and as an image for sanitised HTML (an untrusted notebook, a static viewer)."""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from jupyter_gpumem.reporters.picture import picture, standalone

ROOT = Path(__file__).resolve().parent.parent
IMAGE = re.compile(
    r'<img class="jp-GpuMem-pictureImage" style="([^"]*)" alt="([^"]*)" '
    r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"/>'
)
SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 20" width="100%" '
    'style="max-width:140px" role="img" aria-label="a &amp; b"><text '
    'fill="var(--jp-ui-font-color1,var(--x,#333))">7 GiB</text></svg>'
)


def test_a_picture_is_inline_svg_with_a_hidden_image_of_itself():
    html = picture(SVG)
    style, alt, data = IMAGE.search(html).groups()
    assert "max-width:140px" in style
    # hidden by a rule that only matches an image right after its SVG
    assert "<style>.jp-GpuMem-picture>svg+img{display:none}</style><svg" in html
    assert re.search(r"</svg><img ", html)
    assert alt == "a &amp; b"  # the SVG's label, escaped once
    image = base64.b64decode(data).decode()
    assert image == standalone(SVG) and "var(" not in image
    assert 'fill="#333"' in image  # the innermost fallback
    root = ET.fromstring(image)
    assert root.get("viewBox") == "0 0 100 20"
    assert (root.get("width"), root.get("height")) == ("100", "20")  # an image's own size
    # the inline SVG keeps the theme and restores the text size the wrapper sets to 0
    assert html.startswith(
        '<div class="jp-GpuMem-picture" style="font-size:0;line-height:0"><style>'
    )
    assert (
        'style="font-size:var(--jp-ui-font-size1,13px);line-height:normal;max-width:140px"' in html
    )
    assert "var(--jp-ui-font-color1" in html.split("<img")[0]


@pytest.mark.parametrize("notebook", ["demo.ipynb", "before_you_run.ipynb"])
def test_the_shipped_notebooks_pictures_have_their_image(notebook):
    nb = json.loads((ROOT / "examples" / notebook).read_text())
    htmls = [
        "".join(o["data"]["text/html"])
        for c in nb["cells"]
        for o in c.get("outputs", ())
        if "<svg" in "".join(o.get("data", {}).get("text/html", ""))
    ]
    assert htmls
    for html in htmls:
        n_svg = html.count("<svg")
        images = IMAGE.findall(html)
        assert len(images) == n_svg  # one image per picture
        for _, _, data in images:
            ET.fromstring(base64.b64decode(data))  # a well-formed document
