"""No import cycle among the project's modules (issue #47).

The graph holds the imports a module runs when it is imported: those at its
top level, in a top-level ``if`` (not ``if TYPE_CHECKING:``, which never
runs) or ``try``. An import inside a function runs
when the function is called, which is how a module reaches vLLM's heavy or
platform-bound parts late; it makes no cycle at import time.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("vllm_specextend", "benchmarks", "deploy")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _top_level_imports(tree: ast.Module):
    for node in tree.body:
        body = [node]
        if isinstance(node, ast.If):
            if _type_checking_only(node):
                continue  # never runs: names for annotations only
            body = node.body + node.orelse
        elif isinstance(node, ast.Try):
            body = node.body + [n for h in node.handlers for n in h.body]
        for inner in body:
            if isinstance(inner, (ast.Import, ast.ImportFrom)):
                yield inner


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
    return name == "TYPE_CHECKING" and not node.orelse


def _imported(name: str, path: Path, node, modules) -> set[str]:
    """The project's modules that ``node`` (in module ``name``) imports."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".")
            if path.name != "__init__.py":
                package = package[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join([*package, base] if base else package)
        # ``from package import module`` imports the module too.
        targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
    found = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: set().union(*(_imported(name, path, node, modules) for node in
                                _top_level_imports(ast.parse(path.read_text()))))
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected parts of more than one module
    (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                        if member == node:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
    return found


def test_cycles_are_found_where_they_are():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def cycle_path(graph: dict[str, set[str]], part: list[str]) -> list[str]:
    """One cycle through ``part`` (a strongly connected part), as the modules
    in import order with the first one again at the end."""
    start, members = part[0], set(part)
    came_from, queue = {start: None}, [start]
    for node in queue:  # breadth first, back to ``start``
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                path = [node]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start] if node != start \
                    else [start, start]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{part} is not strongly connected")


def named_cycles(graph: dict[str, set[str]]) -> str:
    return "; ".join(" -> ".join(cycle_path(graph, part)) for part in cycles(graph))


def test_cycles_are_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert named_cycles(graph) == "a -> b -> c -> a"
    assert named_cycles({"a": {"b"}, "b": set()}) == ""


def test_no_import_cycle_in_the_project():
    graph = import_graph()
    assert "vllm_specextend.proposer" in graph
    assert "vllm_specextend.drafting.kept_passes" in graph["vllm_specextend.proposer"]
    assert cycles(graph) == [], f"import cycle: {named_cycles(graph)}"


# The plugin's rooms, top floor first (docs/design.md, "Layout"): a module
# imports from its own floor or below, never from above, with the imports
# inside functions counted too, so that no import runs back up.
FLOORS = (
    ("worker", "plugin", "proposer", "auth"),
    ("drafting",),
    ("retrieval",),
    ("serving",),
    ("compat",),
    ("config", "patching", "_dist_alias", ""),
)


def floor(module: str) -> int:
    parts = module.split(".")
    assert parts[0] == "vllm_specextend", module
    room = parts[1] if len(parts) > 1 else ""
    for level, rooms in enumerate(FLOORS):
        if room in rooms:
            return level
    raise AssertionError(f"{module}: in no floor of FLOORS; add its room there")


def _every_import(node: ast.AST):
    """The imports under ``node`` that may run: all but ``if TYPE_CHECKING:``'s."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif not (isinstance(child, ast.If) and _type_checking_only(child)):
            yield from _every_import(child)


def plugin_graph_with_lazy_imports() -> dict[str, set[str]]:
    """The plugin's modules and every import in them, a function's too."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        if not name.startswith("vllm_specextend"):
            continue
        nodes = list(_every_import(ast.parse(path.read_text())))
        graph[name] = {m for node in nodes for m in _imported(name, path, node, modules)
                       if m.startswith("vllm_specextend")}
    return graph


def test_no_import_runs_back_up():
    graph = plugin_graph_with_lazy_imports()
    assert "vllm_specextend.retrieval.retriever" in graph
    upward = sorted(f"{a} imports {b}" for a, targets in graph.items()
                    for b in targets if floor(b) < floor(a))
    assert upward == []
    assert cycles(graph) == [], f"import cycle: {named_cycles(graph)}"
