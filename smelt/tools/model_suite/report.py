"""The suite's results as a markdown table (last thing the CLI prints) and as JSON."""
from __future__ import annotations

import dataclasses
import json


def _ratio(num, den):
    return f"{num / den:.2f}x" if num and den else "-"


def summary(r) -> str:
    """One case's ratios on one line: printed as each case ends, so a run cut short still shows them."""
    t = r.timings or {}
    ms, comp, peak = t.get("ms", {}), t.get("compile_s", {}), t.get("peak_bytes", {})
    if not ms:
        return ""
    times = " / ".join(f"{ms[k]:.2f}" if ms.get(k) else "-" for k in ("eager", "inductor", "smelt"))
    return (f"ms eager / Inductor / smelt {times}; speed vs eager {_ratio(ms.get('eager'), ms.get('smelt'))}, vs Inductor "
            f"{_ratio(ms.get('inductor'), ms.get('smelt'))}; peak vs eager {_ratio(peak.get('smelt'), peak.get('eager'))}, "
            f"vs Inductor {_ratio(peak.get('smelt'), peak.get('inductor'))}; compile s "
            f"{comp.get('smelt') or 0:.1f} / {comp.get('inductor') or 0:.1f}")


def markdown(results) -> str:
    graphed = any("smelt-ro" in (r.timings or {}).get("ms", {}) for r in results)
    lines = ["| model | mode | result | speedup vs eager | speedup vs Inductor | compile s (smelt / Inductor) "
             "| peak memory vs eager | peak memory vs Inductor |"
             + (" CUDA graphs: smelt vs eager | CUDA graphs: smelt vs Inductor | CUDA graphs: peak reserved vs eager "
                "| CUDA graphs: peak reserved vs Inductor |" if graphed else "") + " note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- | --- | --- |" if graphed else "") + " --- |"]
    for r in results:
        t = r.timings or {}
        ms, comp, peak = t.get("ms", {}), t.get("compile_s", {}), t.get("peak_bytes", {})
        reserved = t.get("peak_reserved", {})
        ours, theirs = ("smelt", "inductor") if comp.get("smelt") else ("smelt-ro", "inductor-ro")  # --graphs-only
        compile_cell = (f"{comp[ours]:.1f} / {comp[theirs]:.1f}" if comp.get(ours) and comp.get(theirs)
                        else (f"{comp[ours]:.1f}" if comp.get(ours) else "-"))
        note = (r.failures[0] if r.failures else (r.notes[0] if r.notes else "")).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.model} | {r.mode} | {r.status} | {_ratio(ms.get('eager'), ms.get('smelt'))} | "
                     f"{_ratio(ms.get('inductor'), ms.get('smelt'))} | {compile_cell} | "
                     f"{_ratio(peak.get('smelt'), peak.get('eager'))} | {_ratio(peak.get('smelt'), peak.get('inductor'))} | "
                     + (f"{_ratio(ms.get('eager'), ms.get('smelt-ro'))} | {_ratio(ms.get('inductor-ro'), ms.get('smelt-ro'))} | "
                        f"{_ratio(reserved.get('smelt-ro'), reserved.get('eager'))} | "
                        f"{_ratio(reserved.get('smelt-ro'), reserved.get('inductor-ro'))} | " if graphed else "")
                     + f"{note[:160]} |")
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "error", "skip")}
    lines.append("")
    lines.append(f"{counts['pass']} passed, {counts['fail'] + counts['error']} failed, {counts['skip']} skipped "
                 f"({counts['fail']} wrong results, {counts['error']} errors)")
    return "\n".join(lines)


def to_json(results) -> str:
    rows = []
    for r in results:
        row = dataclasses.asdict(r)
        row["notes"] = [n for n in r.notes if not n.startswith("Traceback")]
        rows.append(row)
    return json.dumps(rows, indent=1)


def from_json(text: str) -> list:
    from .runner import CaseResult
    return [CaseResult(**row) for row in json.loads(text)]


if __name__ == "__main__":  # scripts/model_suite_shards: one table (and with --json F, one file) from the shards'
    import sys
    args = sys.argv[1:]
    out = None
    if args[:1] == ["--json"]:
        out, args = args[1], args[2:]
    merged = []
    for path in args:
        with open(path) as f:
            merged += from_json(f.read())
    if out:
        with open(out, "w") as f:
            f.write(to_json(merged))
    print(markdown(merged))
