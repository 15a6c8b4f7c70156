"""What a fuzzing run has judged so far, one JSON line per program or finding, so that a run whose
process dies (a kernel that segfaults) goes on in a new process where it stopped."""
from __future__ import annotations

import json
import os

# Every status a judged program can have (runner.Result refuses others, so a new one is counted here).
STATUSES = ("pass", "fail", "crash", "timeout", "segfault", "skip", "unsupported", "ill-conditioned", "refused")


class Journal:
    def __init__(self, path: str | None):
        self.path = path
        self.counts = dict.fromkeys(STATUSES, 0)
        self.judged: set[int] = set()
        self.findings: list[dict] = []  # key, status, where, messages, source, ops_before, ops_after
        if path and os.path.exists(path):
            with open(path) as fh:
                for line in fh:
                    try:
                        self._apply(json.loads(line))
                    except ValueError:  # a line cut short by the process dying
                        pass

    def _apply(self, entry: dict) -> None:
        if "index" in entry:
            if entry["index"] not in self.judged:
                self.judged.add(entry["index"])
                self.counts[entry["status"]] += 1
        elif "finding" in entry:
            f = entry["finding"]
            known = self.find(f["key"])
            if known:
                known["where"] += "; also " + f["where"]
            else:
                self.findings.append(f)
        elif "also" in entry:
            self.find(entry["also"])["where"] += "; also " + entry["where"]

    def find(self, key: str):
        return next((f for f in self.findings if f["key"] == key), None)

    def add(self, entry: dict) -> None:
        self._apply(entry)
        if self.path:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(entry) + "\n")

    def next_index(self) -> int:
        return max(self.judged) + 1 if self.judged else 0
