"""Imports point one way (ARCHITECTURE.md's layer order) and no two modules import each other, however indirectly.

Every import of our own packages in every module is read from the source (ast), function-level ones
included. An import names a module (`from pkg import sub` names pkg.sub when that is a module); a package's
`__init__` running before its submodules is Python's order, not an edge."""
import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
# lower layers first; a module may import its own package and packages of strictly lower layers
LAYERS = {"runtime": 0, "msgq": 0, "visionipc": 1, "cereal": 2, "common": 2, "daemons": 3, "selfdrive_stub": 4, "process_replay": 5}
# modules that sit in another package's layer: the reference's `from msgq.visionipc import ...` re-exports visionipc
LAYER_OF_MODULE = {"msgq.visionipc": "visionipc"}
# known breaks being removed by an open issue, each named; a new one fails the test
KNOWN: dict = {}
KNOWN_CYCLES: dict = {}


def module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(REPO).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, pathlib.Path]:
  """Python modules and compiled extensions (their C source stands for them) of our packages."""
  return {module_name(p): p for pkg in LAYERS for ext in ("*.py", "*.c") for p in sorted((REPO / pkg).rglob(ext))}


def imports_of(name: str, path: pathlib.Path, modules) -> set[str]:
  """The modules of ours that `name` imports."""
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = package.split(".")[:len(package.split(".")) - node.level + 1]
        mod = ".".join(base + ([node.module] if node.module else []))
      else:
        mod = node.module
      targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
    else:
      continue
    out.update(t for t in targets if t.split(".")[0] in LAYERS)
  return out - {name}


def graph() -> dict[str, set[str]]:
  modules = all_modules()
  return {name: imports_of(name, path, modules) if path.suffix == ".py" else set() for name, path in modules.items()}


def layer(module: str) -> tuple[str, int]:
  pkg = LAYER_OF_MODULE.get(module, module.split(".")[0])
  return pkg, LAYERS[pkg]


def layer_breaks(g: dict[str, set[str]]) -> list[str]:
  bad = []
  for mod, targets in sorted(g.items()):
    pkg, lvl = layer(mod)
    for t in sorted(targets):
      tpkg, tlvl = layer(t)
      if tpkg != pkg and tlvl >= lvl and (pkg, tpkg) not in KNOWN:
        bad.append(f"{mod} -> {t} ({pkg} is layer {lvl}, {tpkg} layer {tlvl})")
  return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan, iterative)."""
  index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
  for root in sorted(g):
    if root in index:
      continue
    work = [(root, iter(sorted(g[root])))]
    index[root] = low[root] = counter[0]
    counter[0] += 1
    stack.append(root)
    on_stack.add(root)
    while work:
      v, it = work[-1]
      w = next(it, None)
      if w is None:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
          comp = []
          while True:
            x = stack.pop()
            on_stack.discard(x)
            comp.append(x)
            if x == v:
              break
          if len(comp) > 1:
            out.append(sorted(comp))
      elif w not in g:
        continue
      elif w not in index:
        index[w] = low[w] = counter[0]
        counter[0] += 1
        stack.append(w)
        on_stack.add(w)
        work.append((w, iter(sorted(g[w]))))
      elif w in on_stack:
        low[v] = min(low[v], index[w])
  return out


def test_imports_point_down_the_layers():
  assert not layer_breaks(graph())


def test_no_modules_import_each_other_in_a_circle():
  assert not [c for c in cycles(graph()) if tuple(c) not in KNOWN_CYCLES]


def test_known_breaks_still_exist_so_the_lists_stay_honest():
  g = graph()
  seen = {(layer(m)[0], layer(t)[0]) for m, ts in g.items() for t in ts}
  assert not set(KNOWN) - seen, f"fixed: drop {sorted(set(KNOWN) - seen)} from KNOWN"
  fixed = set(KNOWN_CYCLES) - {tuple(c) for c in cycles(g)}
  assert not fixed, f"fixed: drop {sorted(fixed)} from KNOWN_CYCLES"


@pytest.mark.parametrize("g,expect", [
  ({"cereal.a": {"selfdrive_stub.b"}, "selfdrive_stub.b": set()}, ["cereal.a -> selfdrive_stub.b"]),
  ({"msgq.a": {"runtime.b"}, "runtime.b": set()}, ["msgq.a -> runtime.b"]),
  ({"daemons.a": {"cereal.b"}, "cereal.b": set()}, []),
])
def test_an_upward_or_sideways_import_is_reported(g, expect):
  assert [b.split(" (")[0] for b in layer_breaks(g)] == expect


def test_a_circle_is_reported():
  assert cycles({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}) == [["a.x", "a.y", "a.z"]]
