"""Recording a route never writes through a link another user planted: route files are
created O_EXCL|O_NOFOLLOW in a directory that is this user's and not writable by everyone."""
import os
import stat

import pytest

from cereal.route import LOG, Route, RouteError, RouteWriter
from visionipc.nv12 import get_nv12_info

VICTIM = "root's file, must survive\n"
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="simulating another user needs root (chown)")


def _record(path):
  """A route with one event and one frame, written the way the logger writes one."""
  from cereal.messaging import new_message
  w, h = 64, 32
  stride, y_height, _, size = get_nv12_info(w, h)
  with RouteWriter(str(path), camera="tici", generator="test") as writer:
    msg = new_message("carState", valid=True)
    writer.add_event(msg.to_bytes(), 1, "carState")
    writer.add_frame("road", bytes(size), 0, 0, 0, w, h, stride, stride * y_height)


@pytest.fixture
def victim(tmp_path):
  path = tmp_path / "victim"
  path.write_text(VICTIM)
  return path


@pytest.mark.parametrize("planted", ["header.json.tmp", LOG, "fcamera.nv12z"])
def test_a_planted_link_in_a_shared_dir_is_never_written_through(tmp_path, victim, planted):
  """A world-writable sticky dir (like /tmp) with a link planted in it: the recorder refuses the dir."""
  shared = tmp_path / "shared"
  shared.mkdir()
  shared.chmod(0o1777)
  (shared / planted).symlink_to(victim)
  with pytest.raises(RouteError, match="writable by every user"):
    _record(shared)
  assert victim.read_text() == VICTIM


@pytest.mark.parametrize("planted", [LOG, "fcamera.nv12z"])
def test_a_planted_link_in_a_private_dir_is_refused_not_followed(tmp_path, victim, planted):
  route = tmp_path / "r"
  route.mkdir(mode=0o700)
  (route / planted).symlink_to(victim)
  with pytest.raises(RouteError, match="already exists"):
    _record(route)
  assert victim.read_text() == VICTIM and (route / planted).is_symlink()


def test_a_planted_header_tmp_link_is_left_alone_and_the_route_is_whole(tmp_path, victim):
  route = tmp_path / "r"
  route.mkdir(mode=0o700)
  (route / "header.json.tmp").symlink_to(victim)
  _record(route)
  assert victim.read_text() == VICTIM
  with Route(str(route)) as r:
    assert r.header["complete"] and len(r.raw_events()) == 1 and len(r.frames("road")) == 1


def test_a_route_dir_that_is_a_symlink_is_refused(tmp_path, victim):
  target = tmp_path / "elsewhere"
  target.mkdir(mode=0o700)
  (tmp_path / "r").symlink_to(target)
  with pytest.raises(RouteError, match="is a symlink"):
    _record(tmp_path / "r")
  assert os.listdir(target) == []


@as_root
def test_a_route_dir_owned_by_another_user_is_refused(tmp_path):
  route = tmp_path / "r"
  route.mkdir(mode=0o755)
  os.chown(route, NOBODY, NOBODY)
  with pytest.raises(RouteError, match=f"owned by uid {NOBODY}, not by you"):
    _record(route)
  assert os.listdir(route) == []


def test_a_new_route_dir_and_its_files_are_owner_only(tmp_path):
  _record(tmp_path / "r")
  assert stat.S_IMODE(os.lstat(tmp_path / "r").st_mode) == 0o700
  for name in os.listdir(tmp_path / "r"):
    assert stat.S_IMODE(os.lstat(tmp_path / "r" / name).st_mode) == 0o600, name
