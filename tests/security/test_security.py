"""Security checks: who may see, who may publish, and what untrusted bytes can make us do.

- every file, socket and directory a running stack creates in its namespace is owner-only;
- the ZMQ backend listens on loopback unless told otherwise;
- a model daemon cannot publish a control service: not through PubMaster, not by grabbing the raw endpoint;
- model metadata and runtime artifacts never unpickle arbitrary objects;
- message decoding has a traversal limit, so a small message cannot make a receiver read without bound.
"""
import base64
import io
import json
import os
import pickle
import stat
import struct
import subprocess
import sys
import time
import zipfile

import numpy as np
import onnx
import pytest

import msgq
from cereal import messaging
from cereal.services import SERVICE_LIST
from daemons.common.metadata import ModelMetadataError, load_metadata, load_pickled_slices
from daemons.dmonitoringmodeld.model_state import MODEL_PATH
from msgq import namespace as ns_mod
from msgq.zmq_backend import port_for
from runtime import artifact
from runtime.errors import ArtifactError
from runtime.program import target_for
from repo_paths import REPO_ROOT
from runtime.runner import OnnxRunner

MODEL_DAEMONS = ("modeld", "dmonitoringmodeld")
# services that steer the car or gate engagement; no model daemon may ever write one
CONTROL_SERVICES = ("carControl", "carState", "selfdriveState", "engageRequest", "driverMonitoringState",
                    "extrinsicsCalibration", "managerState")


def _mode(path: str) -> int:
  return stat.S_IMODE(os.lstat(path).st_mode)


def _wait_for(predicate, timeout: float = 60.0, what: str = "condition") -> None:
  deadline = time.monotonic() + timeout
  while not predicate():
    if time.monotonic() > deadline:
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.1)


# -- owner-only namespace ------------------------------------------------------------------------------------

def test_running_camerad_leaves_only_owner_only_files(namespace):
  """A real camerad process: its segments are 0600, its VisionIPC control socket 0600 or in a 0700 dir."""
  env = dict(os.environ, PYMODELD_PROCESS="camerad")
  proc = subprocess.Popen([sys.executable, "-m", "selfdrive_stub.producers.camerad", "--camera", "tici"], cwd=REPO_ROOT,
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    sock_path = os.path.join(namespace.runtime_dir, "visionipc_camerad.sock")
    _wait_for(lambda: os.path.exists(sock_path) and os.path.exists(
      os.path.join(namespace.shm_dir, "cabinCameraState")), what="camerad's socket and segments")
    for d in (namespace.shm_dir, namespace.runtime_dir, os.path.dirname(namespace.runtime_dir)):
      assert _mode(d) == 0o700, f"{d} is {oct(_mode(d))}"
      assert os.lstat(d).st_uid == os.getuid()
    entries = [os.path.join(namespace.shm_dir, n) for n in os.listdir(namespace.shm_dir)]
    entries += [os.path.join(namespace.runtime_dir, n) for n in os.listdir(namespace.runtime_dir)]
    assert any(p.endswith("narrowRoadCameraState") for p in entries)
    for path in entries:
      st = os.lstat(path)
      assert st.st_uid == os.getuid(), path
      assert not stat.S_ISLNK(st.st_mode), path
      assert _mode(path) & 0o077 == 0, f"{path} is readable or writable by others: {oct(_mode(path))}"
  finally:
    proc.terminate()
    assert proc.wait(30) == 0


def test_foreign_owned_namespace_dir_is_refused(namespace, tmp_path):
  """A runtime dir replaced by a symlink (someone else's directory) is refused, never followed."""
  victim = tmp_path / "elsewhere"
  victim.mkdir()
  os.rmdir(namespace.runtime_dir)
  os.symlink(victim, namespace.runtime_dir)
  try:
    with pytest.raises(PermissionError, match=namespace.prefix):
      ns_mod.runtime_dir()
  finally:
    os.unlink(namespace.runtime_dir)


# -- ZMQ binds loopback --------------------------------------------------------------------------------------

def _listening(port: int) -> set[str]:
  """Local addresses (hex, as /proc/net/tcp writes them) listening on `port`."""
  out = set()
  for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    if not os.path.exists(table):
      continue
    with open(table) as f:
      for line in f.readlines()[1:]:
        cols = line.split()
        addr, hexport = cols[1].rsplit(":", 1)
        if int(hexport, 16) == port and cols[3] == "0A":   # 0A = LISTEN
          out.add(addr)
  return out


@pytest.mark.parametrize("bind_addr, expect", [(None, "0100007F"), ("0.0.0.0", "00000000")])
def test_zmq_publisher_binds_loopback_unless_configured(monkeypatch, namespace, bind_addr, expect):
  monkeypatch.setenv("ZMQ", "1")
  if bind_addr is None:
    monkeypatch.delenv("MSGQ_ZMQ_BIND_ADDR", raising=False)
  else:
    monkeypatch.setenv("MSGQ_ZMQ_BIND_ADDR", bind_addr)
  endpoint = f"secz{os.getpid() % 1000}{namespace.prefix[-6:]}"
  pub = msgq.pub_sock(endpoint)
  try:
    assert _listening(port_for(endpoint)) == {expect}
  finally:
    pub.close()


# -- publishing rights ---------------------------------------------------------------------------------------

def test_services_table_gives_model_daemons_only_their_outputs():
  owned = {d: sorted(n for n, s in SERVICE_LIST.items() if s.owner == d) for d in MODEL_DAEMONS}
  assert owned == {"modeld": ["cameraOdometry", "drivingModelData", "modelV2", "usbGpuState"],
                   "dmonitoringmodeld": ["driverStateV2"]}
  for s in CONTROL_SERVICES:
    assert SERVICE_LIST[s].owner not in MODEL_DAEMONS, s


_TRY_PUBLISH = """
import sys
from cereal import messaging
from msgq import MultiplePublishersError
from cereal.messaging import pub_sock
for service in sys.argv[1:]:
  try:
    messaging.PubMaster([service])           # the process name comes from PYMODELD_PROCESS, as the manager sets it
    print(service, "PUBMASTER_OPENED")
  except messaging.ServiceOwnershipError as e:
    print(service, "REFUSED", e)
  try:
    pub_sock(service)                        # bypassing PubMaster: the live owner still holds the endpoint
    print(service, "RAW_OPENED")
  except MultiplePublishersError as e:
    print(service, "TAKEN", e)
"""


@pytest.mark.parametrize("daemon", MODEL_DAEMONS)
def test_model_daemon_process_cannot_publish_control_services(namespace, spawn_python, daemon):
  """A process launched as a model daemon is refused every control service, even through the raw bus."""
  owner_pm = messaging.PubMaster(list(CONTROL_SERVICES), allow_foreign=True)   # the live owners
  try:
    child = spawn_python(_TRY_PUBLISH, *CONTROL_SERVICES, env={"PYMODELD_PROCESS": daemon})
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert "PUBMASTER_OPENED" not in out and "RAW_OPENED" not in out, out
    for service in CONTROL_SERVICES:
      assert f"{service} REFUSED service {service!r} is owned by" in out, out
      assert f"{service} TAKEN" in out, out
    assert out.count(f"{daemon!r} may not publish") == len(CONTROL_SERVICES), out
  finally:
    owner_pm.close()


def test_daemon_sources_never_ask_for_foreign_publishing():
  """allow_foreign is for tests and tools; no daemon or safety consumer may use it."""
  offenders = []
  for pkg in ("daemons", "selfdrive_stub"):
    for root, _, files in os.walk(os.path.join(REPO_ROOT, pkg)):
      for f in files:
        if f.endswith(".py"):
          with open(os.path.join(root, f)) as fh:
            if "allow_foreign" in fh.read():
              offenders.append(os.path.join(root, f))
  assert offenders == []


# -- no arbitrary unpickling ---------------------------------------------------------------------------------

class _Evil:
  """Unpickling this calls os.system; a safe loader must refuse before that happens."""

  def __init__(self, marker: str):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f"touch {self.marker}",))


def _onnx_with_props(tmp_path, props: dict) -> str:
  model = onnx.load(MODEL_PATH)
  del model.metadata_props[:]
  for k, v in props.items():
    model.metadata_props.add(key=k, value=v)
  path = str(tmp_path / "evil.onnx")
  onnx.save(model, path)
  return path


def test_malicious_pickle_in_model_metadata_is_refused_and_never_runs(tmp_path):
  marker = tmp_path / "pwned"
  blob = base64.b64encode(pickle.dumps({"face": _Evil(str(marker))})).decode()
  with pytest.raises(ModelMetadataError, match="refusing to unpickle posix.system|refusing to unpickle os.system"):
    load_pickled_slices(blob)
  path = _onnx_with_props(tmp_path, {"output_slices": blob})
  with pytest.raises(ModelMetadataError, match="refusing to unpickle"):
    load_metadata(path)
  assert not marker.exists()
  # the same loader still reads a legitimate pickle of slices
  assert load_pickled_slices(base64.b64encode(pickle.dumps({"a": slice(0, 4)})).decode()) == {"a": slice(0, 4)}


def test_dmonitoringmodeld_refuses_to_start_on_a_malicious_model(tmp_path, namespace):
  marker = tmp_path / "pwned"
  blob = base64.b64encode(pickle.dumps({"face": _Evil(str(marker))})).decode()
  path = _onnx_with_props(tmp_path, {"output_slices": blob})
  r = subprocess.run([sys.executable, "-m", "daemons.dmonitoringmodeld", "--model", path], cwd=REPO_ROOT,
                     env=dict(os.environ, PYMODELD_PROCESS="dmonitoringmodeld"), capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert "refusing to unpickle" in r.stderr.strip().splitlines()[-1], r.stderr[-2000:]
  assert not marker.exists()


def test_runtime_artifact_with_pickled_constant_is_refused(tmp_path):
  """An artifact whose constant is an object array (a pickle inside .npy) is refused; nothing runs."""
  path = str(tmp_path / "a.zip")
  header = {"format": artifact.FORMAT, "format_version": artifact.FORMAT_VERSION,
            "runtime_version": artifact.RUNTIME_VERSION, "model_hash": "h", "program_key": "", "weights_digest": "",
            "device_target": target_for("CPU").program_name, "backend": "compiled", "codegen_config": {},
            "metadata": {}, "graph": {"inputs": {}, "outputs": [], "nodes": [], "opset": 17, "consts": {"w": "c0.npy"}}}
  marker = tmp_path / "pwned"
  bio = io.BytesIO()
  np.lib.format.write_array(bio, np.array([_Evil(str(marker))], dtype=object), allow_pickle=True)
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("header.json", json.dumps(header))
    z.writestr("c0.npy", bio.getvalue())
  with pytest.raises(ArtifactError, match="constant 'w' is not a plain array"):
    artifact.load(path)
  assert not marker.exists()


def test_runtime_artifact_has_no_pickle_inside(tmp_path):
  """A saved artifact of a real model is JSON + raw arrays: no member carries a pickle opcode stream."""
  runner = OnnxRunner(MODEL_PATH, "CPU")
  program = runner.program
  path = str(tmp_path / "dm.zip")
  artifact.save(program, path, model_hash="x")
  with zipfile.ZipFile(path) as z:
    for name in z.namelist():
      data = z.read(name)
      assert not data.startswith(b"\x80"), f"{name} looks like a pickle"
      if name.endswith(".npy"):
        hdr = np.lib.format.read_magic(z.open(name))
        assert hdr[0] >= 1
        arr = np.lib.format.read_array(z.open(name), allow_pickle=False)
        assert arr.dtype != object
  artifact.load(path, device="CPU")


# -- decoding limits -----------------------------------------------------------------------------------------

def _aliased_events_message(n_alias: int, blob_len: int) -> tuple[bytes, bytes]:
  """A selfdriveState whose `events` list has one long string and n_alias short ones; returns the honest
  bytes and a copy whose short-string pointers all point at the long string (reads amplified n_alias times)."""
  msg = messaging.new_message("selfdriveState")
  msg.selfdriveState.events = ["a" * blob_len] + ["b"] * n_alias
  honest = msg.to_bytes()
  words = list(struct.unpack(f"<{len(honest) // 8}Q", honest))
  seg_start = 1    # one segment: the table is one word (count-1 u32 + size u32)

  def list_ptr(w):
    return w & 3 == 1 and (w >> 32) & 7 == 2
  first = next(i for i in range(seg_start, len(words) - n_alias)
               if list_ptr(words[i]) and words[i] >> 35 == blob_len + 1
               and all(list_ptr(words[i + k]) and words[i + k] >> 35 == 2 for k in range(1, n_alias + 1)))
  off0 = (words[first] >> 2) & 0x3FFFFFFF
  off0 = off0 - (1 << 30) if off0 & (1 << 29) else off0
  target = first + 1 + off0
  for k in range(1, n_alias + 1):
    off = target - (first + k + 1)
    words[first + k] = ((off & 0x3FFFFFFF) << 2) | 1 | (2 << 32) | ((blob_len + 1) << 35)
  return honest, struct.pack(f"<{len(words)}Q", *words)


def test_decode_traversal_limit_refuses_amplified_message():
  honest, aliased = _aliased_events_message(n_alias=200, blob_len=4000)
  assert len(aliased) == len(honest)
  evt = messaging.log_from_bytes(honest, service="selfdriveState")
  assert len(evt.selfdriveState.events) == 201
  with pytest.raises(messaging.MessageDecodeError, match="selfdriveState"):
    messaging.log_from_bytes(aliased, service="selfdriveState")


def test_receiver_process_survives_amplified_message(namespace, spawn_python):
  """A SubMaster in another process counts the amplified message as malformed and keeps going."""
  _, aliased = _aliased_events_message(n_alias=200, blob_len=4000)
  child = spawn_python("""
    import sys, time
    from cereal import messaging
    sm = messaging.SubMaster(["selfdriveState"])
    print("READY", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (sm.malformed["selfdriveState"] and sm.updated["selfdriveState"]):
      sm.update(100)
    print("MALFORMED", sm.malformed["selfdriveState"], "EVENTS", list(sm["selfdriveState"].events), flush=True)
  """)
  assert child.stdout.readline().strip() == "READY"
  pub = msgq.pub_sock("selfdriveState", segment_size=SERVICE_LIST["selfdriveState"].queue_size)
  good = messaging.new_message("selfdriveState")
  good.selfdriveState.events = ["ok"]
  good = good.to_bytes()
  deadline = time.monotonic() + 60
  while child.poll() is None and time.monotonic() < deadline:
    pub.send(aliased)
    time.sleep(0.05)
    pub.send(good)
    time.sleep(0.05)
  out, err = child.communicate(timeout=30)
  assert child.returncode == 0, err
  count = int(out.split("MALFORMED")[1].split()[0])
  assert count >= 1 and "EVENTS ['ok']" in out, out
