"""A Report (capture.py) as one self-contained HTML page: no files beside it, nothing fetched."""
from __future__ import annotations

import html

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; width: 100%; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; cursor: pointer; user-select: none; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; padding: 8px; overflow-x: auto; font-size: 12px; }
.bar { display: flex; height: 28px; border: 1px solid #999; margin: 0.5em 0; }
.bar div { height: 100%; }
.legend span { display: inline-block; margin-right: 1.5em; }
.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: middle; }
.muted { color: #777; }
"""

# Sorting by a column header's click; the page is complete without it. `data-ready` tells a test
# the script ran to its end (an error before it leaves the attribute unset).
SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, column) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var descending = th.dataset.order !== "desc";
      th.dataset.order = descending ? "desc" : "asc";
      rows.sort(function (a, b) {
        var x = a.cells[column].dataset.value || a.cells[column].textContent;
        var y = b.cells[column].dataset.value || b.cells[column].textContent;
        var nx = parseFloat(x), ny = parseFloat(y);
        var order = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
        return descending ? -order : order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
document.body.dataset.ready = "yes";
"""

COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#bab0ac"]


def _e(value) -> str:
    return html.escape(str(value))


def _num(value: float, text: str) -> str:
    return f'<td class="num" data-value="{value!r}">{_e(text)}</td>'


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _time_split(report) -> str:
    total = sum(report.time_split.values()) or 1.0
    bars, legend = [], []
    for (label, seconds), color in zip(report.time_split.items(), COLORS):
        share = seconds / total
        bars.append(f'<div title="{_e(label)}: {seconds:.3f} s" style="width:{share * 100:.2f}%;background:{color}"></div>')
        legend.append(f'<span><span class="swatch" style="background:{color}"></span>{_e(label)}: '
                      f'{seconds:.3f} s ({share:.0%})</span>')
    return f'<div class="bar">{"".join(bars)}</div><div class="legend">{"".join(legend)}</div>'


def _kernels(report) -> str:
    rows = []
    for k in sorted(report.kernels, key=lambda k: -k.seconds):
        per_call = k.seconds / k.calls if k.calls else 0.0
        share = "-" if k.bandwidth_share is None else f"{k.bandwidth_share:.0%}"
        rows.append(
            f'<tr><td><a href="#{_e(k.name)}">{_e(k.name)}</a></td><td>{k.graph}</td><td>{_e(k.origins)}</td>'
            + _num(k.calls, str(k.calls)) + _num(per_call * 1e6, f"{per_call * 1e6:.1f}")
            + _num(k.seconds * 1e3, f"{k.seconds * 1e3:.3f}") + _num(k.bytes_per_call, _bytes(k.bytes_per_call))
            + _num(k.bandwidth_share or 0.0, share) + "</tr>")
    return ('<table class="sortable" id="kernels"><thead><tr><th>kernel</th><th>graph</th><th>source ops</th>'
            '<th>calls</th><th>us per call</th><th>total ms</th><th>bytes per call</th>'
            '<th>share of copy bandwidth</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table>")


def _graphs(report) -> str:
    parts = []
    for g in report.graphs:
        stages = ", ".join(f"{k} {v:.3f} s" for k, v in g.stage_seconds.items()) or "from the cache"
        fallbacks = ", ".join(g.fallback_ops) or "none"
        planned = "symbolic sizes" if g.planned_peak_bytes is None else _bytes(g.planned_peak_bytes)
        kernels = [k for k in report.kernels if k.graph == g.number]
        sources = "".join(
            f'<details id="{_e(k.name)}"><summary>{_e(k.name)} <span class="muted">({_e(k.path)})</span></summary>'
            f"<pre>{_e(k.source)}</pre></details>" for k in kernels)
        parts.append(
            f'<h3>graph {g.number} ({_e(g.kind)})</h3>'
            f"<p>{len(g.kernels)} kernels; ran through ATen: {_e(fallbacks)}; compile stages: {_e(stages)}; "
            f"planned peak of its own buffers: {_e(planned)}</p>"
            f"{sources}<details><summary>wrapper <span class=\"muted\">({_e(g.wrapper_path)})</span></summary>"
            f"<pre>{_e(g.wrapper_source)}</pre></details>")
    return "".join(parts) or "<p>No graph was compiled by smelt.</p>"


def _breaks(report) -> str:
    if not report.graph_breaks:
        return "<p>None: every captured function compiled whole.</p>"
    rows = "".join(f"<tr><td>{_e(reason)}</td>{_num(count, str(count))}</tr>"
                   for reason, count in sorted(report.graph_breaks.items(), key=lambda kv: -kv[1]))
    return ('<table class="sortable" id="breaks"><thead><tr><th>reason</th><th>count</th></tr></thead>'
            f"<tbody>{rows}</tbody></table>")


def _aten(report) -> str:
    rows = "".join(f"<tr><td>{_e(op)}</td>{_num(calls, str(calls))}{_num(s * 1e3, f'{s * 1e3:.3f}')}</tr>"
                   for op, calls, s in report.aten_ops)
    return ('<table class="sortable" id="aten"><thead><tr><th>op</th><th>calls</th><th>ms (own CPU time)</th>'
            f"</tr></thead><tbody>{rows}</tbody></table>")


def render(report) -> str:
    bandwidth = ", ".join(f"{device} {bps / 1e9:.1f} GB/s" for device, bps in report.copy_bandwidth.items()) or "-"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(report.title)}</title><style>{STYLE}</style></head>
<body>
<h1>{_e(report.title)}</h1>
<p>{_e(report.device)}; {report.seconds:.2f} s captured; {len(report.graphs)} graphs, {len(report.kernels)} kernels;
{_e(report.peak_memory)}; measured copy bandwidth: {_e(bandwidth)}.</p>
<h2>Where the time went</h2>
{_time_split(report)}
<p class="muted">Kernel and ATen times are what the profiler measured over the whole capture (the device's time on
CUDA, the CPU's own time there); compile stages are smelt's (Dynamo's and AOTAutograd's time falls in the rest).</p>
<h2>Kernels</h2>
{_kernels(report)}
<p class="muted">Bytes per call count each tensor argument once: the least a kernel moves. The share is those bytes
per second of the kernel's measured time against a plain copy on the same device.</p>
<h2>Graph breaks</h2>
{_breaks(report)}
<h2>ATen ops</h2>
<p class="muted">Over the whole capture: the compiles' own ATen calls are among them.</p>
{_aten(report)}
<h2>Graphs</h2>
{_graphs(report)}
<script>{SCRIPT}</script>
</body></html>
"""
