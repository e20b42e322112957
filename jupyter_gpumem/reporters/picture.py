"""A picture in an HTML output: the inline SVG (themed, with hover tips) where HTML is
trusted, and the same picture as an image where it is not.

JupyterLab sanitises the HTML of an untrusted notebook: ``<svg>`` and ``<style>`` are
removed (the SVG's text nodes stay, run together), while ``<img>`` with a ``data:`` source
and ``style`` attributes are kept. So the picture is written as

    <div style="font-size:0">              (hides the text an untrusted SVG leaves behind)
      <style>.jp-GpuMem-picture>svg+img{display:none}</style>
      <svg style="font-size:13px ...">     (trusted: drawn, interactive, themed)
      <img src=data:image/svg+xml;base64,...>  (hidden beside its SVG; shown without it)

Trusted (and in viewers that render HTML as is, nbviewer) the SVG is drawn and the image
hidden; sanitised, the image is shown on a white ground, with the colours the SVG falls
back to outside JupyterLab's theme. The rule only hides an image that follows its SVG, so
a trusted output's rule cannot hide an untrusted one's image. Every picture also has a
``text/plain`` twin in its bundle.
"""

from __future__ import annotations

import base64
import re

# var(--jp-name, fallback) -> fallback, innermost first
HIDE = ".jp-GpuMem-picture>svg+img{display:none}"
_VAR = re.compile(r"var\(--[\w-]+\s*,\s*([^()]*?)\)")
_OPEN = re.compile(r"<svg\b[^>]*>")
_LABEL = re.compile(r'aria-label="([^"]*)"')
_MAX_WIDTH = re.compile(r"max-width:\s*([\d.]+px)")


_VIEWBOX = re.compile(r'viewBox="0 0 ([\d.]+) ([\d.]+)"')


def standalone(svg: str) -> str:
    """The SVG as a document of its own: theme variables replaced by their fallbacks, and
    the size of its view box as its own (an image needs one; "100%" means nothing there)."""
    out = svg
    while True:
        new = _VAR.sub(lambda m: m.group(1).strip(), out)
        if new == out:
            break
        out = new
    head = _OPEN.search(out)
    box = _VIEWBOX.search(head.group(0)) if head else None
    if head is not None and box is not None:
        tag = head.group(0).replace(' width="100%"', "")
        tag = tag.replace("<svg ", f'<svg width="{box.group(1)}" height="{box.group(2)}" ', 1)
        out = out[: head.start()] + tag + out[head.end() :]
    return out


def picture(svg: str, font_size: str = "var(--jp-ui-font-size1,13px)") -> str:
    """``svg`` (with ``xmlns`` and a ``style`` on its root) drawn inline, with an image
    fallback for sanitised HTML (see the module's docstring)."""
    head = _OPEN.search(svg)
    if head is None:
        return svg
    tag = head.group(0)
    label = _LABEL.search(tag)
    width = _MAX_WIDTH.search(tag)
    inline_tag = tag.replace('style="', f'style="font-size:{font_size};line-height:normal;', 1)
    if inline_tag == tag:
        inline_tag = tag[:-1] + f' style="font-size:{font_size};line-height:normal">'
    inline = inline_tag + svg[head.end() :]
    data = base64.b64encode(standalone(svg).encode()).decode("ascii")
    img_style = "width:100%;height:auto;background-color:#fff" + (
        f";max-width:{width.group(1)}" if width else ""
    )
    alt = label.group(1) if label else "picture"  # (escaped as the SVG's label)
    return (
        '<div class="jp-GpuMem-picture" style="font-size:0;line-height:0">'
        f"<style>{HIDE}</style>{inline}"
        f'<img class="jp-GpuMem-pictureImage" style="{img_style}" alt="{alt}" '
        f'src="data:image/svg+xml;base64,{data}"/></div>'
    )
