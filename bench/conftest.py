"""Benchmark session plumbing: the report collector, a progress line per case, the report files.

``make bench`` (= ``pytest -q bench``) runs every case; at the end the rows collected by the
tests are written to bench/out/ (report.json, report.md, estimate_vs_roofline.png; see
bench/report.py). Long cases print ``[bench i/n] ...`` lines as they start and finish, through
pytest's terminal reporter so they show under output capture and -q.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))   # bench/cases.py, bench/report.py

import report  # noqa: E402


class Collector:
    def __init__(self):
        self.rows: list[dict] = []
        self.cpu: dict = {}        # case -> {"eager_cpu_us": ..., "nkisim_cpu_s": ...}
        self.device: dict = {}     # case -> device time in us (only with a Neuron device)

    def add_cpu(self, case: str, **timings):
        self.cpu.setdefault(case, {}).update(timings)


COLLECTOR = Collector()
_state = {"total": 0, "done": 0, "config": None}


def pytest_collection_modifyitems(session, config, items):
    _state["total"] = len(items)
    _state["config"] = config


def _say(message: str) -> None:
    config = _state["config"]
    reporter = config.pluginmanager.getplugin("terminalreporter") if config else None
    if reporter is None:
        print(message, file=sys.stderr, flush=True)
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():      # show the line now, not in the captured output
        reporter.ensure_newline()
        reporter.write_line(message)


@pytest.fixture(autouse=True)
def progress(request):
    """Announce each case with its position; yields a function for extra progress messages."""
    _state["done"] += 1
    prefix = f"[bench {_state['done']}/{_state['total']}]"
    start = time.perf_counter()
    _say(f"{prefix} {request.node.name} ...")
    yield lambda message: _say(f"{prefix}   {message}")
    _say(f"{prefix} {request.node.name} finished in {time.perf_counter() - start:.1f} s")


@pytest.fixture(scope="session")
def collector():
    return COLLECTOR


def pytest_sessionfinish(session, exitstatus):
    if not COLLECTOR.rows:
        return
    paths = report.write(COLLECTOR.rows, COLLECTOR.cpu, COLLECTOR.device)
    _say("benchmark report (cost-model estimates unless device_us is set): " + ", ".join(
        str(p.relative_to(Path(__file__).resolve().parent.parent)) for p in paths))
