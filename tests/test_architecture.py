"""The design's boundaries, checked: no import cycle between modules, and no source file that has grown
past what one reader holds in mind. import-linter's contracts (pyproject.toml) are checked by
`make lint`, which .ci/run runs before the tests."""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("agents", "contracts", "controlplane", "embedded_broker", "worker_runtime")
MAX_LINES = 400
# Files allowed past MAX_LINES, each with the reason it stays whole.
LONG_FILES: dict[str, str] = {}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in sorted(edges):
        if root in index:
            continue
        visit(root)
        work = [(root, iter(sorted(edges[root])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    visit(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while not component or component[-1] != node:
                    component.append(stack.pop())
                    on_stack.discard(component[-1])
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_modules():
    sys.path.insert(0, str(REPO))
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & graph.modules for m in graph.modules}
    assert _cycles(edges) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_source_file_is_too_long_without_a_reason():
    long = {
        str(path.relative_to(REPO)): n
        for package in (*PACKAGES, "benchmarks")
        for path in (REPO / package).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES and "migrations" not in path.parts
    }
    assert set(long) <= set(LONG_FILES), {k: v for k, v in long.items() if k not in LONG_FILES}
