"""An HTML page from the report's Markdown: the same tables, the plots inline.

The report writes a small, known subset of Markdown (headings, paragraphs,
pipe tables, images with an italic caption, inline code); this converts
exactly that subset, so the page and report.md never say different things.
"""

from __future__ import annotations

import html
import re

IMAGE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<src>[^)]+)\)$")
HEADING = re.compile(r"^(?P<level>#{1,4}) (?P<text>.*)$")
INLINE_CODE = re.compile(r"`([^`]+)`")
EMPHASIS = re.compile(r"(?<![\w*])\*([^*]+)\*(?![\w*])")
TABLE_RULE = re.compile(r"^\|(?:-+\|)+$")
STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:110em}"
    "table{border-collapse:collapse;font-size:85%;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top}"
    "th{background:#eee}img{max-width:100%;border:1px solid #ddd}"
    "code{background:#f4f4f4}"
)


def inline(text: str) -> str:
    escaped = html.escape(text, quote=False).replace("\\|", "|")
    escaped = INLINE_CODE.sub(r"<code>\1</code>", escaped)
    return EMPHASIS.sub(r"<em>\1</em>", escaped)


def _cells(line: str) -> list[str]:
    body = line.strip()[1:-1]
    cells = re.split(r"(?<!\\)\|", body)
    return [c.strip() for c in cells]


def _table(rows: list[str]) -> list[str]:
    header, body = rows[0], [r for r in rows[1:] if not TABLE_RULE.match(r.strip())]
    out = ["<table>", "<tr>" + "".join(f"<th>{inline(c)}</th>" for c in _cells(header)) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{inline(c)}</td>" for c in _cells(r)) + "</tr>" for r in body]
    return [*out, "</table>"]


def markdown_to_html(markdown: str, title: str) -> str:
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
    ]
    lines = markdown.splitlines()
    index = 0
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            out.append("<p>" + inline(" ".join(paragraph)) + "</p>")
            paragraph.clear()

    while index < len(lines):
        line = lines[index]
        if line.startswith("|"):
            flush()
            rows = []
            while index < len(lines) and lines[index].startswith("|"):
                rows.append(lines[index])
                index += 1
            out += _table(rows)
            continue
        heading, image = HEADING.match(line), IMAGE.match(line.strip())
        if heading:
            flush()
            level = len(heading["level"])
            out.append(f"<h{level}>{inline(heading['text'])}</h{level}>")
        elif image:
            flush()
            src = html.escape(image["src"])
            out.append(f'<figure><img src="{src}" alt="{html.escape(image["alt"])}"></figure>')
        elif not line.strip():
            flush()
        else:
            paragraph.append(line)
        index += 1
    flush()
    return "\n".join([*out, "</body></html>", ""])
