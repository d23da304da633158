"""Fixtures: the committed sample routes (short slices keep the tests fast)."""
import os

import pytest

from cereal.route import Route
from repo_paths import REPO_ROOT

ROUTES = os.path.join(REPO_ROOT, "process_replay", "routes")


@pytest.fixture(scope="session")
def tici_route_path():
  path = os.path.join(ROUTES, "tici")
  if not os.path.isfile(os.path.join(path, "header.json")):
    pytest.fail(f"sample route missing: {path} (python -m process_replay.make_routes)")
  return path


@pytest.fixture(scope="session")
def tici_route(tici_route_path):
  with Route(tici_route_path) as route:
    yield route


@pytest.fixture(scope="session")
def mici_route_path():
  path = os.path.join(ROUTES, "mici")
  if not os.path.isfile(os.path.join(path, "header.json")):
    pytest.fail(f"sample route missing: {path} (python -m process_replay.make_routes)")
  return path


@pytest.fixture(scope="session")
def lanechange_route_path():
  path = os.path.join(ROUTES, "lanechange")
  if not os.path.isfile(os.path.join(path, "header.json")):
    pytest.fail(f"sample route missing: {path} (python -m process_replay.make_routes --routes lanechange)")
  return path
