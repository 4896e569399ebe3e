"""``study.html``: the bundle's Markdown as one self-contained page that reads on screen and prints.

The report's converter (:func:`pytest_afd.report.html.markdown_to_html`)
makes the page (same tables, images as ``data:`` URIs, contents, sortable
tables); this adds what a published study needs on top: bullet lists (the
Markdown writes one item per paragraph), the first line set apart as the
page's headline, and print rules (A4 margins, no navigation or sort hints,
tables and figures not split across pages, link targets spelled out).
"""

from __future__ import annotations

import re
from pathlib import Path

from pytest_afd.report.html import markdown_to_html

ITEM = re.compile(r"^<p>- (?P<text>.*)</p>$")
FIRST_PARAGRAPH = "<p>"
HEADLINE_OPEN = '<p class="headline" role="note">'
PRINT_STYLE = (
    "<style>"
    "p.headline{font-size:110%;font-weight:bold;border-left:6px solid #c60;padding:.4em .8em;"
    "background:#fff4e5}"
    "ul{margin:.4em 0 .8em 1.2em}table{display:block;overflow-x:auto;max-width:100%}"
    "@media print{@page{size:A4;margin:14mm}"
    "body{margin:0;max-width:none;font-size:10pt}nav#contents{display:none}"
    "th{cursor:auto;background:#eee !important}"
    "table,figure,tr,img{page-break-inside:avoid;break-inside:avoid}"
    "h2,h3{page-break-after:avoid;break-after:avoid}"
    "p.headline{background:none;border-left:4px solid #000}"
    "table{display:table;width:100%;table-layout:fixed;font-size:6.5pt;overflow:visible}"
    "td,th{overflow-wrap:anywhere;padding:1px 2px}img{max-width:100%;border:none}}"
    "</style>"
)


def _lists(page: str) -> str:
    out: list[str] = []
    in_list = False
    for line in page.split("\n"):
        item = ITEM.match(line)
        if item and not in_list:
            out.append("<ul>")
            in_list = True
        elif not item and in_list:
            out.append("</ul>")
            in_list = False
        out.append(f"<li>{item['text']}</li>" if item else line)
    return "\n".join(out)


def study_page(markdown: str, title: str, base_dir: Path) -> str:
    page = markdown_to_html(markdown, title, base_dir)
    page = page.replace(FIRST_PARAGRAPH, HEADLINE_OPEN, 1)
    page = page.replace("</head>", PRINT_STYLE + "</head>", 1)
    return _lists(page)
