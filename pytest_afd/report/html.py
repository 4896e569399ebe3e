"""A single self-contained HTML page from the report's Markdown: the same tables, plots embedded.

The report writes a small, known subset of Markdown (headings, paragraphs,
pipe tables, images with an italic caption, inline code, emphasis, links to
anchors); this converts exactly that subset, so the page and report.md never
say different things. The page needs nothing beside it: every image is a
``data:`` URI, a table of contents links every stage and stack, each heading
and each table row has an anchor, tables sort by a click on a column header
(a few lines of inline script), and rows that failed or got worse are
highlighted.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

IMAGE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<src>[^)]+)\)$")
HEADING = re.compile(r"^(?P<level>#{1,4}) (?P<text>.*)$")
INLINE_CODE = re.compile(r"`([^`]+)`")
EMPHASIS = re.compile(r"(?<![\w*])\*([^*]+)\*(?![\w*])")
STRONG = re.compile(r"\*\*([^*]+)\*\*")
LINK = re.compile(r"\[([^\]]+)\]\((#[A-Za-z0-9_.-]+)\)")
TABLE_RULE = re.compile(r"^\|(?:-+\|)+$")
ANCHOR_TEXT = re.compile(r"[^A-Za-z0-9_.-]+")
TOC_LEVELS = (2, 3)
# A row is highlighted when a cell says it failed, errored or got worse.
BAD_CELL = re.compile(r"^(failed|error)\b|^B worse$")
PNG_MIME = "image/png"
STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:110em}"
    "table{border-collapse:collapse;font-size:85%;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top}"
    "th{background:#eee;cursor:pointer}th:hover{background:#ddd}"
    "tr.bad td{background:#fde2e2}tr:target td{outline:2px solid #f90}"
    "img{max-width:100%;border:1px solid #ddd}code{background:#f4f4f4}"
    "nav ul{columns:2;font-size:90%}nav li.l3{margin-left:1.5em}"
)
# Click a header to sort its table; numbers (the leading number of a cell) sort numerically.
SORT_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (header, column) {
    header.title = "sort by this column";
    header.addEventListener("click", function () {
      var rows = Array.prototype.slice.call(table.querySelectorAll("tr")).slice(1);
      var ascending = header.getAttribute("data-order") !== "asc";
      header.setAttribute("data-order", ascending ? "asc" : "desc");
      var key = function (row) {
        var text = row.children[column] ? row.children[column].textContent.trim() : "";
        var number = parseFloat(text);
        return isNaN(number) ? [1, text] : [0, number];
      };
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        var order = x[0] - y[0] || (x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0);
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { table.appendChild(row); });
    });
  });
});
"""


def anchor(text: str) -> str:
    return ANCHOR_TEXT.sub("_", text).strip("._") or "x"


def inline(text: str) -> str:
    escaped = html.escape(text, quote=False).replace("\\|", "|")
    escaped = INLINE_CODE.sub(r"<code>\1</code>", escaped)
    escaped = LINK.sub(r'<a href="\2">\1</a>', escaped)
    escaped = STRONG.sub(r"<strong>\1</strong>", escaped)
    return EMPHASIS.sub(r"<em>\1</em>", escaped)


def _cells(line: str) -> list[str]:
    body = line.strip()[1:-1]
    cells = re.split(r"(?<!\\)\|", body)
    return [c.strip() for c in cells]


class _Anchors:
    """Unique element ids: a repeated name gets -2, -3, ..."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def take(self, name: str) -> str:
        candidate, index = name, 1
        while candidate in self.used:
            index += 1
            candidate = f"{name}-{index}"
        self.used.add(candidate)
        return candidate


def _table(rows: list[str], section: str, anchors: _Anchors) -> list[str]:
    header, body = rows[0], [r for r in rows[1:] if not TABLE_RULE.match(r.strip())]
    out = [
        '<table class="sortable">',
        "<tr>" + "".join(f"<th>{inline(c)}</th>" for c in _cells(header)) + "</tr>",
    ]
    for row in body:
        cells = _cells(row)
        row_id = anchors.take(f"{section}-{anchor(cells[0].replace('`', ''))}")
        bad = any(BAD_CELL.match(cell) for cell in cells)
        css = ' class="bad"' if bad else ""
        out.append(f'<tr id="{row_id}"{css}>' + "".join(f"<td>{inline(c)}</td>" for c in cells)
                   + "</tr>")
    return [*out, "</table>"]


def _image_source(src: str, base_dir: Path | None) -> str:
    """The image as a data: URI when its file is under ``base_dir``; the link otherwise."""
    if base_dir is None:
        return src
    path = base_dir / src
    if not path.is_file():
        return src
    payload = base64.b64encode(path.read_bytes()).decode("ascii")
    return f"data:{PNG_MIME};base64,{payload}"


def _heading_id(level: int, text: str, parent: str, anchors: _Anchors) -> str:
    """``stage_a`` for "stage_a: ...", ``stage_a-Stack_abc`` below it: short, stable ids."""
    name = anchor(text.split(":")[0].replace("`", ""))
    return anchors.take(name if level <= 2 or not parent else f"{parent}-{name}")  # noqa: PLR2004


def markdown_to_html(markdown: str, title: str, base_dir: Path | None = None) -> str:
    """The page for ``markdown``; images under ``base_dir`` are embedded as data: URIs."""
    body: list[str] = []
    toc: list[tuple[int, str, str]] = []
    anchors = _Anchors()
    lines = markdown.splitlines()
    index = 0
    paragraph: list[str] = []
    section = parent = "top"

    def flush() -> None:
        if paragraph:
            body.append("<p>" + inline(" ".join(paragraph)) + "</p>")
            paragraph.clear()

    while index < len(lines):
        line = lines[index]
        if line.startswith("|"):
            flush()
            rows = []
            while index < len(lines) and lines[index].startswith("|"):
                rows.append(lines[index])
                index += 1
            body += _table(rows, section, anchors)
            continue
        heading, image = HEADING.match(line), IMAGE.match(line.strip())
        if heading:
            flush()
            level, text = len(heading["level"]), heading["text"]
            section = _heading_id(level, text, parent, anchors)
            if level == 2:  # noqa: PLR2004
                parent = section
            if level in TOC_LEVELS:
                toc.append((level, section, text))
            body.append(f'<h{level} id="{section}">{inline(text)}</h{level}>')
        elif image:
            flush()
            src = html.escape(_image_source(image["src"], base_dir))
            body.append(f'<figure><img src="{src}" alt="{html.escape(image["alt"])}"></figure>')
        elif not line.strip():
            flush()
        else:
            paragraph.append(line)
        index += 1
    flush()
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        *_insert_toc(body, toc),
        f"<script>{SORT_SCRIPT}</script>",
        "</body></html>",
        "",
    ])


def _insert_toc(body: list[str], toc: list[tuple[int, str, str]]) -> list[str]:
    """The contents list right after the page's first heading (the title)."""
    if not toc:
        return body
    items = [f'<li class="l{level}"><a href="#{target}">{inline(text)}</a></li>'
             for level, target, text in toc]
    nav = ['<nav id="contents"><h2>Contents</h2><ul>', *items, "</ul></nav>"]
    first = next((i for i, part in enumerate(body) if part.startswith("<h1")), -1)
    return [*body[: first + 1], *nav, *body[first + 1 :]]
