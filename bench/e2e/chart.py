"""The README's chart of the e2e harness: plain SVG from report.py's rows, no plotting library."""

from __future__ import annotations


def svg(rows: list, title: str, source: str) -> str:
    """Two bar charts, one row per run: the step time with a save in flight (steps >= 2, no
    validation) and the GPU memory the writer still held after the offload, i.e. what the next
    wake-up had to do without. Plain SVG, no plotting library."""
    data = [r for r in rows if r["steps"]]
    label_w, bar_w, row_h, top = 370, 280, 22, 48
    height = top + row_h * len(data) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + 2 * (bar_w + 90)}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           f'<text x="4" y="16" font-size="14" font-weight="bold">{_esc(title)}</text>']
    panels = (("step s with a save in flight", "step_plain_s", "#4878a8"),
              ("GiB still reserved after the offload", "held_gib", "#c8553d"))
    for p, (name, key, color) in enumerate(panels):
        x0 = label_w + p * (bar_w + 90)
        vmax = max([r[key] for r in data if r[key] is not None] or [1.0]) or 1.0
        out.append(f'<text x="{x0}" y="{top - 10}" font-weight="bold">{_esc(name)}</text>')
        for i, r in enumerate(data):
            y = top + i * row_h
            v = r[key]
            if p == 0:
                out.append(f'<text x="4" y="{y + 14}">{_esc(r["run"])} (vLLM {r["vllm"]})</text>')
            if v is None:
                out.append(f'<text x="{x0 + 2}" y="{y + 14}" fill="#888">-</text>')
                continue
            w = max(1, int(bar_w * v / vmax))
            out.append(f'<rect x="{x0}" y="{y + 3}" width="{w}" height="{row_h - 6}" fill="{color}"/>')
            out.append(f'<text x="{x0 + w + 4}" y="{y + 14}">{v:.2f}</text>')
    out.append(f'<text x="4" y="{height - 12}" fill="#555">from {_esc(source)}: '
               'medians over steps >= 2 without validation; held = reserved GPU memory after the offload</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _esc(text) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
