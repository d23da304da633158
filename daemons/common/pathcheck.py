"""A daemon run by hand refuses, in one line, a working directory whose modules would shadow the project's
packages (python -m puts the working directory first on sys.path, so a runtime.py there wins over runtime/).

Invariant: this module imports only the standard library, so it runs before anything a shadow could replace.
"""
import importlib.util
import os
import sys

PACKAGES = ("cereal", "daemons", "msgq", "runtime", "selfdrive_stub", "visionipc")
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USAGE_EXIT = 2


def shadowed(packages=PACKAGES, checkout: str = CHECKOUT) -> list[tuple[str, str]]:
  """(package, the file that would be imported instead) for each package found outside the checkout."""
  found = []
  for name in packages:
    spec = importlib.util.find_spec(name) if name not in sys.modules else None
    origin = spec.origin if spec is not None else None
    if origin and not os.path.abspath(origin).startswith(checkout + os.sep):
      found.append((name, origin))
  return found


def refuse_shadowed(prog: str) -> None:
  """Exit 2 with one line naming the shadowing file when a project package would be imported from elsewhere."""
  bad = shadowed()
  if bad:
    name, origin = bad[0]
    print(f"{prog}: {origin} shadows the {name} package (python -m puts the working directory on the path): "
          "run from another directory, or with python -P", file=sys.stderr, flush=True)
    sys.exit(USAGE_EXIT)
