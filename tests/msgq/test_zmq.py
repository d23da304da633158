"""ZMQ backend (env ZMQ=1): pub/sub over loopback TCP on per-namespace ports, every peer authenticated
with CURVE keys from the namespace's owner-only secret."""
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
import zmq

import msgq
from msgq.namespace import Namespace
from msgq.zmq_backend import ephemeral_range, fnv1a64, namespace_secret, port_for


@pytest.fixture
def zmq_mode(monkeypatch, namespace):
  monkeypatch.setenv("ZMQ", "1")
  return namespace.prefix  # endpoints carry the prefix so parallel runs do not share ports


def _receive_eventually(pub, sub, payload: bytes, timeout_s: float = 30.0):
  """Slow joiner: resend until the TCP subscription is live."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    pub.send(payload)
    msg = sub.receive()
    if msg is not None:
      return msg
  raise AssertionError("no message over ZMQ")


def test_fnv1a_port_is_deterministic():
  assert fnv1a64(b"") == 0xCBF29CE484222325
  assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
  assert port_for("modelV2") == port_for("modelV2")
  lo, hi = ephemeral_range()
  assert 8023 <= port_for("modelV2") <= 65535 and not lo <= port_for("modelV2") <= hi


def test_pub_sub_over_loopback_tcp(zmq_mode, spawn_python):
  endpoint = f"zmq_{zmq_mode}"
  sub = msgq.sub_sock(endpoint, timeout=100)
  child = spawn_python(f"""
    import time, msgq
    pub = msgq.pub_sock({endpoint!r})
    for i in range(3000):
      pub.send(b"hello over tcp")
      time.sleep(0.01)
  """)
  deadline = time.monotonic() + 30
  msg = None
  while msg is None and time.monotonic() < deadline:
    msg = sub.receive()
  assert msg == b"hello over tcp"
  assert sub._base.sock.getsockopt_string(__import__("zmq").LAST_ENDPOINT).startswith("tcp://127.0.0.1:")
  child.kill()


def test_second_publisher_on_same_port_raises(zmq_mode):
  endpoint = f"dup_{zmq_mode}"
  first = msgq.pub_sock(endpoint)
  with pytest.raises(msgq.MultiplePublishersError, match=str(port_for(endpoint))):
    msgq.pub_sock(endpoint)
  first.close()


def test_poller_and_conflate(zmq_mode):
  endpoint = f"conf_{zmq_mode}"
  pub = msgq.pub_sock(endpoint)
  poller = msgq.Poller()
  sub = msgq.sub_sock(endpoint, poller=poller, conflate=True, timeout=100)
  _receive_eventually(pub, sub, b"warmup")
  msgq.drain_sock_raw(sub)
  for i in range(50):
    pub.send(b"%d" % i)
  assert poller.poll(30_000) == [sub]
  got, deadline = [], time.monotonic() + 30
  while b"49" not in got and time.monotonic() < deadline:
    got += msgq.drain_sock_raw(sub, wait_for_one=True)
  assert got[-1] == b"49"
  assert len(got) < 50  # conflate replaced queued messages (ZMQ may still hand over some in flight)
  with pytest.raises(msgq.IpcError, match="ZMQ"):
    pub.all_readers_updated()


# -- namespaces and peers that are not ours ---------------------------------------------------------------

NOBODY = 65534


def test_ports_are_per_namespace():
  assert len({port_for("modelV2", prefix=p) for p in ("", "run1", "run2", "run3")}) == 4


def test_a_subscriber_of_another_namespace_gets_nothing_even_on_the_publishers_port(zmq_mode):
  endpoint = "crossns"
  pub = msgq.pub_sock(endpoint)
  ours = msgq.sub_sock(endpoint, timeout=100)
  with Namespace() as other:
    assert port_for(endpoint) != pub._impl.port
    theirs = msgq.sub_sock(endpoint, timeout=50)
    theirs._base.sock.connect(f"tcp://127.0.0.1:{pub._impl.port}")  # even aimed at our port: no handshake
    assert _receive_eventually(pub, ours, b"ours") == b"ours"
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
      pub.send(b"ours")
      assert theirs.receive() is None, other.prefix
    theirs.close()
  pub.close()


def test_the_namespace_key_is_owner_only_and_made_once(zmq_mode, namespace):
  a = namespace_secret()
  assert namespace_secret() == a and len(a) == 32
  path = os.path.join(namespace.runtime_dir, "zmq.key")
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
  os.chmod(path, 0o644)
  with pytest.raises(msgq.IpcError, match="mode 0600"):
    msgq.pub_sock("keycheck")


def _nobody_can_run(python: str, path: str) -> bool:
  probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-S", "-c",
                          "import msgq, zmq"], env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": path},
                         cwd="/", capture_output=True, timeout=60)
  return probe.returncode == 0


@pytest.fixture
def nobody_imports():
  """A world-readable directory holding a copy of what the `nobody` children import (msgq, zmq and its bundled
  libraries), so they import this checkout's msgq even when the checkout sits in an owner-only directory (a root
  home, a `mktemp -d`). The children run with -S, so they see only this copy and the interpreter's stdlib."""
  if os.getuid() != 0 or shutil.which("setpriv") is None:
    pytest.skip("running a peer as another user needs root and setpriv")
  root = tempfile.mkdtemp(prefix="pymodeld-nobody-")
  try:
    os.chmod(root, 0o755)
    site_packages = os.path.dirname(os.path.dirname(zmq.__file__))
    sources = [os.path.dirname(msgq.__file__), os.path.dirname(zmq.__file__), os.path.join(site_packages, "pyzmq.libs")]
    for src in sources:
      if os.path.isdir(src):
        shutil.copytree(src, os.path.join(root, os.path.basename(src)), ignore=shutil.ignore_patterns("__pycache__"))
    for dirpath, dirnames, filenames in os.walk(root):
      for name in dirnames:
        os.chmod(os.path.join(dirpath, name), 0o755)
      for name in filenames:
        os.chmod(os.path.join(dirpath, name), 0o755 if name.endswith(".so") or ".so." in name else 0o644)
    if not _nobody_can_run(sys.executable, root):
      pytest.skip(f"user {NOBODY} cannot run this interpreter ({sys.executable}) with a copy of msgq and zmq; "
                  "it needs an interpreter outside owner-only directories")
    yield root
  finally:
    shutil.rmtree(root, ignore_errors=True)


def _as_nobody(code: str, prefix: str, imports: str) -> subprocess.Popen:
  env = {"PATH": os.environ.get("PATH", ""), "OPENPILOT_PREFIX": prefix, "ZMQ": "1", "HOME": "/tmp", "PYTHONPATH": imports}
  check = f"import msgq\nassert msgq.__file__.startswith({imports!r}), msgq.__file__\n"
  return subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable,
                           "-S", "-c", check + textwrap.dedent(code)], env=env, cwd="/", stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


@pytest.fixture
def nobody_cleanup(namespace):
  yield
  shutil.rmtree(f"/tmp/pymodeld-{NOBODY}/{namespace.prefix}", ignore_errors=True)
  try:
    os.rmdir(f"/tmp/pymodeld-{NOBODY}")   # its base, as its own exit would have, when no other namespace is in it
  except OSError:
    pass


def test_another_user_on_the_same_prefix_and_port_receives_nothing(zmq_mode, namespace, nobody_cleanup, nobody_imports):
  endpoint = "secret_stuff"
  pub = msgq.pub_sock(endpoint)
  ours = msgq.sub_sock(endpoint, timeout=100)
  spy = _as_nobody(f"""
    import time, msgq
    sub = msgq.sub_sock({endpoint!r}, timeout=100)
    print("listening", flush=True)
    got, deadline = 0, time.monotonic() + 3
    while time.monotonic() < deadline:
      got += sub.receive() is not None
    print("GOT", got, flush=True)
  """, namespace.prefix, nobody_imports)
  try:
    assert spy.stdout.readline().strip() == "listening", spy.stderr.read()
    assert _receive_eventually(pub, ours, b"for root only") == b"for root only"
    while spy.poll() is None:
      pub.send(b"for root only")
      time.sleep(0.01)
    out, err = spy.communicate(timeout=30)
    assert out.strip() == "GOT 0", out + err
  finally:
    spy.kill()
    pub.close()


def test_another_user_binding_the_port_first_injects_nothing_and_the_real_publisher_is_refused(
    zmq_mode, namespace, nobody_cleanup, nobody_imports):
  endpoint = "carControl_like"
  rogue = _as_nobody(f"""
    import time, msgq
    pub = msgq.pub_sock({endpoint!r})
    print("bound", flush=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
      pub.send(b"INJECTED")
      time.sleep(0.005)
  """, namespace.prefix, nobody_imports)
  try:
    assert rogue.stdout.readline().strip() == "bound", rogue.stderr.read()
    with pytest.raises(msgq.MultiplePublishersError, match="already bound"):
      msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint, timeout=100)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
      assert sub.receive() is None  # the handshake with a publisher that lacks our key never completes
    sub.close()
  finally:
    rogue.kill()
    rogue.wait()
