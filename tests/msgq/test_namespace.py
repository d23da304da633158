import os
import secrets
import shutil
import stat
import subprocess

import pytest

from msgq import namespace
from msgq.namespace import Namespace
import msgq


def _mode(path):
  return stat.S_IMODE(os.stat(path).st_mode)


def test_fixture_namespace_is_active(namespace):
  assert os.environ["OPENPILOT_PREFIX"] == namespace.prefix
  assert namespace.shm_dir == f"/dev/shm/msgq_{namespace.prefix}"
  assert os.path.isdir(namespace.shm_dir) and os.path.isdir(namespace.runtime_dir)


def test_dirs_are_owner_only(namespace):
  assert _mode(namespace.shm_dir) == 0o700
  assert _mode(namespace.runtime_dir) == 0o700
  assert _mode(os.path.dirname(namespace.runtime_dir)) == 0o700


def test_namespace_is_cleaned_up_and_env_restored(namespace):
  outer = os.environ["OPENPILOT_PREFIX"]
  with Namespace() as inner:
    assert namespace.prefix != inner.prefix
    assert os.environ["OPENPILOT_PREFIX"] == inner.prefix
    assert namespace.shm_dir != inner.shm_dir
    with open(os.path.join(namespace.shm_dir, "x"), "wb"):
      pass
    with open(os.path.join(inner.shm_dir, "seg"), "wb") as f:
      f.write(b"x")
    with open(os.path.join(inner.runtime_dir, "sock"), "wb"):
      pass
  assert not os.path.exists(inner.shm_dir)
  assert not os.path.exists(inner.runtime_dir)
  assert os.environ["OPENPILOT_PREFIX"] == outer
  assert os.path.exists(os.path.join(namespace.shm_dir, "x"))


def test_env_removed_when_there_was_none(monkeypatch):
  monkeypatch.delenv("OPENPILOT_PREFIX")
  with Namespace("explicit_name") as ns:
    assert namespace.prefix() == "explicit_name"
    assert namespace.shm_dir() == ns.shm_dir == "/dev/shm/msgq_explicit_name"
    assert namespace.runtime_dir() == ns.runtime_dir
  assert "OPENPILOT_PREFIX" not in os.environ
  assert namespace.prefix() is None
  assert namespace.shm_dir_path() == "/dev/shm/msgq"


@pytest.mark.parametrize("bad", ["a/b", "..", ".", "x\0y"])
def test_bad_prefix_is_refused(monkeypatch, bad):
  with pytest.raises(ValueError, match="OPENPILOT_PREFIX"):
    Namespace(bad)
  monkeypatch.setenv("OPENPILOT_PREFIX", bad.replace("\0", "/"))
  with pytest.raises(ValueError, match="OPENPILOT_PREFIX"):
    namespace.shm_dir()


def test_children_inherit_the_namespace(namespace, spawn_python):
  child = spawn_python("from msgq import namespace; print(namespace.prefix(), namespace.shm_dir())")
  out, err = child.communicate(timeout=60)
  assert child.returncode == 0, err
  assert out.split() == [namespace.prefix, namespace.shm_dir]


def test_bus_files_go_away_with_the_namespace():
  with Namespace() as ns:
    pub, sub = msgq.pub_sock("x"), msgq.sub_sock("x")
    handle = msgq.fake_event_handle("x")
    pub.send(b"1")
    assert sub.receive() == b"1"
    assert os.listdir(ns.shm_dir) == ["x"]
    assert all(_mode(os.path.join(ns.runtime_dir, f)) == 0o600 for f in os.listdir(ns.runtime_dir))
    pub.close(), sub.close(), handle.close()
  assert not os.path.exists(ns.shm_dir) and not os.path.exists(ns.runtime_dir)


NOBODY = 65534


@pytest.mark.parametrize("which", ["shm", "runtime base", "runtime prefix"])
def test_a_namespace_dir_pre_created_by_another_user_is_refused_in_one_line_that_says_how_to_fix_it(
    monkeypatch, tmp_path, which):
  """Another user (here: a dir chowned to nobody) who creates a run's directory first must not be able to
  make the run use it, nor crash it with a traceback: the refusal is a typed NamespaceError."""
  prefix = f"foreign{os.getpid()}_{which[-4:]}"
  monkeypatch.setenv("OPENPILOT_PREFIX", prefix)
  monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
  path = {"shm": f"/dev/shm/msgq_{prefix}", "runtime base": str(tmp_path / "pymodeld"),
          "runtime prefix": str(tmp_path / "pymodeld" / prefix)}[which]
  if which == "runtime prefix":
    os.mkdir(tmp_path / "pymodeld", 0o700)
  os.mkdir(path, 0o777)
  os.chown(path, NOBODY, NOBODY)
  try:
    with pytest.raises(msgq.NamespaceError) as e:
      namespace.shm_dir() if which == "shm" else namespace.runtime_dir()
    message = str(e.value)
    assert "\n" not in message and path in message and f"uid {NOBODY}" in message and "remove it" in message
    assert isinstance(e.value, PermissionError)  # callers that caught the old error still do
    assert os.stat(path).st_uid == NOBODY and os.listdir(path) == []  # untouched
  finally:
    os.rmdir(path)


def test_a_symlink_in_place_of_the_shm_dir_is_refused_not_followed(monkeypatch, tmp_path):
  prefix = f"link{os.getpid()}"
  monkeypatch.setenv("OPENPILOT_PREFIX", prefix)
  os.symlink(tmp_path, f"/dev/shm/msgq_{prefix}")
  try:
    with pytest.raises(msgq.NamespaceError, match="is a symlink"):
      msgq.pub_sock("x")
    assert os.listdir(tmp_path) == []
  finally:
    os.unlink(f"/dev/shm/msgq_{prefix}")


def _dead_pid() -> int:
  p = subprocess.Popen(["true"])
  p.wait()
  return p.pid


def test_a_generated_namespace_left_by_a_killed_process_is_swept_when_the_next_one_is_made(monkeypatch, tmp_path):
  """A process SIGKILLed inside Namespace() left /dev/shm/msgq_ns<pid>_<hex> and its runtime dir behind. The
  next process to make a generated namespace removes those whose process is gone; one whose process runs stays,
  and a symlink named like a stale one is not followed."""
  dead = _dead_pid()
  stale, live = f"ns{dead}_{secrets.token_hex(4)}", f"ns{os.getpid()}_{secrets.token_hex(4)}"
  target = tmp_path / "not-a-namespace"
  target.mkdir()
  (target / "keep").write_bytes(b"x")
  link = namespace.shm_dir_path(f"ns{dead}_{secrets.token_hex(4)}")
  try:
    namespace.runtime_base()
    for p in (stale, live):
      os.mkdir(namespace.shm_dir_path(p), 0o700)
      with open(os.path.join(namespace.shm_dir_path(p), "seg"), "wb") as f:
        f.write(b"x")
      os.mkdir(namespace.runtime_dir_path(p), 0o700)
    os.symlink(target, link)
    monkeypatch.setattr(namespace, "_swept_auto", False)
    with Namespace():
      pass
    assert not os.path.exists(namespace.shm_dir_path(stale)) and not os.path.exists(namespace.runtime_dir_path(stale))
    assert os.path.isdir(namespace.shm_dir_path(live)) and os.path.isdir(namespace.runtime_dir_path(live))
    assert os.path.islink(link) and (target / "keep").read_bytes() == b"x"
    assert os.path.basename(link)[len("msgq_"):] not in namespace.sweep_dead(namespace.AUTO_STEM), "left alone, not reported"
  finally:
    for p in (stale, live):
      shutil.rmtree(namespace.shm_dir_path(p), ignore_errors=True)
      shutil.rmtree(namespace.runtime_dir_path(p), ignore_errors=True)
    if os.path.islink(link):
      os.unlink(link)


def test_sweeping_creates_no_runtime_base_and_the_last_namespace_out_removes_it(monkeypatch, tmp_path):
  """The per-user base of the runtime dirs is made with the first runtime dir and removed when the last one in it
  goes, so a run leaves nothing in /tmp; a sweep, or asking where a namespace lives, makes nothing."""
  monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
  base = tmp_path / "pymodeld"
  assert namespace.sweep_dead(namespace.AUTO_STEM) == []
  assert namespace.runtime_dir_path("somewhere").startswith(str(base)) and not base.exists()
  with Namespace() as outer:
    with Namespace():
      assert base.is_dir() and stat.S_IMODE(base.stat().st_mode) == 0o700
    assert base.is_dir() and os.path.isdir(outer.runtime_dir), "the other namespace's dir keeps the base"
  assert not base.exists()
  stale = f"ns{_dead_pid()}_{secrets.token_hex(4)}"
  namespace.runtime_base()
  os.mkdir(namespace.runtime_dir_path(stale), 0o700)
  assert namespace.sweep_dead(namespace.AUTO_STEM) == [stale]
  assert not base.exists()


def test_a_link_planted_where_the_base_was_freed_is_never_followed_when_a_runtime_dir_is_made(monkeypatch, tmp_path):
  """Between the base's check and the runtime dir's mkdir another of our processes may remove the empty base, and
  someone else may put a symlink in its name: the dir is made through an fd of the checked base, so the link is
  refused in one line and nothing is made where it points."""
  monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
  base, elsewhere = tmp_path / "pymodeld", tmp_path / "theirs"
  elsewhere.mkdir()
  checked = namespace.runtime_base

  def check_then_swap():
    out = checked()
    os.rmdir(base)
    os.symlink(elsewhere, base)
    return out

  monkeypatch.setattr(namespace, "runtime_base", check_then_swap)
  with pytest.raises(namespace.NamespaceError, match="not a private directory"):
    namespace.make_runtime_dir(namespace.runtime_dir_path("victim"))
  assert list(elsewhere.iterdir()) == []
