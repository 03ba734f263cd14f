"""Render the report's blocks to Markdown (report.md) and to one self-contained HTML page
(index.html: figures embedded as base64, no script or font from the network)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from smallinit.core.markdown import table

VERDICT_CLASS = {"supported": "ok", "contradicted": "bad", "inconclusive": "na", "not run": "na"}


@dataclass
class Block:
    kind: str  # h1 h2 h3 p note list table figure verdicts lead
    content: object  # lead: its sentences
    caption: str = ""  # lead: the command one sentence quotes, set as code ("" for none)


def _md_table(df: pd.DataFrame) -> str:
    return table(list(df.columns), df.astype(str).values.tolist())


def to_markdown(blocks: list[Block]) -> str:
    out = []
    for b in blocks:
        if b.kind in ("h1", "h2", "h3"):
            out.append("#" * int(b.kind[1]) + " " + str(b.content))
        elif b.kind in ("p", "note"):
            out.append(("> " if b.kind == "note" else "") + str(b.content))
        elif b.kind == "lead":
            text = " ".join(b.content)
            out.append(text.replace(b.caption, f"`{b.caption}`") if b.caption else text)
        elif b.kind == "list":
            out.append("\n".join(f"- {x}" for x in b.content))
        elif b.kind in ("table", "verdicts"):
            if b.caption:
                out.append(f"*{b.caption}*")
            out.append(_md_table(b.content))
        elif b.kind == "figure":
            out.append(f"![{b.content.title}]({b.content.file})\n\n*{b.content.caption}*")
    return "\n\n".join(out) + "\n"


CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1180px;margin:24px auto;padding:0 20px;
color:#1d2330;line-height:1.45;background:#fff}
h1{font-size:1.7em;margin-bottom:.2em}h2{border-bottom:2px solid #e3e7ee;padding-bottom:4px;margin-top:1.8em}
h3{margin-top:1.3em}table{border-collapse:collapse;margin:8px 0 14px;font-size:.86em}
th,td{border:1px solid #d8dde6;padding:4px 8px;text-align:left;vertical-align:top}th{background:#f2f4f8}
tr:nth-child(even) td{background:#fafbfc}figure{margin:10px 0 22px}figure img{max-width:100%;border:1px solid #e3e7ee}
figcaption{font-size:.86em;color:#4a5263;margin-top:4px}.note{background:#fff7e0;border-left:4px solid #f0b429;
padding:8px 12px;margin:10px 0}.v{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;
white-space:nowrap;font-size:.9em}.v.ok{background:#d9f2e3;color:#135c33}.v.bad{background:#fbdada;color:#8a1c1c}
.v.na{background:#e8eaef;color:#444c5c}.caption{font-size:.86em;color:#4a5263;font-style:italic}
code{background:#f2f4f8;padding:0 3px;border-radius:3px}ul{margin-top:4px}
.lead{font-size:1.08em;background:#eef4fb;border-left:4px solid #3b7dd8;padding:10px 14px;margin:12px 0 18px}
"""

# Counts the figures that decoded and keeps the text of what the first screen shows, for the
# headless-browser checks (experiments/report/screenshot.py).
SCRIPT = """window.addEventListener('load',function(){var i=Array.prototype.slice.call(document.images);
document.body.setAttribute('data-images',i.length);
document.body.setAttribute('data-images-loaded',i.filter(function(x){return x.complete&&x.naturalWidth>0}).length);
document.body.setAttribute('data-height',document.documentElement.scrollHeight);
var top=Array.prototype.filter.call(document.body.children,function(e){return e.getBoundingClientRect().top<window.innerHeight});
document.body.setAttribute('data-first-screen',top.map(function(e){return e.innerText}).join(' / '));});"""


def _html_table(df: pd.DataFrame, verdict_col: str | None = None) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for r in df.itertuples(index=False):
        cells = []
        for col, v in zip(df.columns, r):
            text = html.escape(str(v))
            if col == verdict_col:
                text = f'<span class="v {VERDICT_CLASS.get(str(v), "na")}">{text}</span>'
            cells.append(f"<td>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def to_html(blocks: list[Block], title: str, fig_dir: Path, embed: bool = True) -> str:
    body = []
    for b in blocks:
        if b.kind in ("h1", "h2", "h3"):
            body.append(f"<{b.kind}>{html.escape(str(b.content))}</{b.kind}>")
        elif b.kind == "p":
            body.append(f"<p>{html.escape(str(b.content))}</p>")
        elif b.kind == "note":
            body.append(f'<div class="note">{html.escape(str(b.content))}</div>')
        elif b.kind == "lead":
            text = html.escape(" ".join(b.content))
            if b.caption:
                text = text.replace(html.escape(b.caption), f"<code>{html.escape(b.caption)}</code>")
            body.append(f'<p id="lead" class="lead">{text}</p>')
        elif b.kind == "list":
            body.append("<ul>" + "".join(f"<li>{html.escape(str(x))}</li>" for x in b.content) + "</ul>")
        elif b.kind in ("table", "verdicts"):
            if b.caption:
                body.append(f'<div class="caption">{html.escape(b.caption)}</div>')
            body.append(_html_table(b.content, "verdict" if b.kind == "verdicts" else None))
        elif b.kind == "figure":
            f = b.content
            if embed:
                data = base64.b64encode((fig_dir / f.file).read_bytes()).decode()
                src = f"data:image/png;base64,{data}"
            else:
                src = f.file
            body.append(f'<figure><img src="{src}" alt="{html.escape(f.title)}">'
                        f"<figcaption>{html.escape(f.caption)}</figcaption></figure>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style><script>{SCRIPT}</script></head><body>{''.join(body)}</body></html>\n")
