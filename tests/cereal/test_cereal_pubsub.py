"""PubMaster / SubMaster / socket helpers over real msgq sockets, across real processes.

Timeouts here are hang guards only (generous, for a loaded 2-core machine); nothing asserts speed.
"""
import json
import time


from cereal.messaging import (PubMaster, SubMaster, drain_sock, log_from_bytes,
                              new_message, recv_one, recv_one_or_none, recv_sock, sub_sock)
from cereal.services import SERVICE_LIST

PUBLISH_MODEL = """
import sys, time
from cereal.messaging import PubMaster, new_message
pm = PubMaster(["modelV2"])            # owner taken from PYMODELD_PROCESS
print("ready", flush=True)
frame = 0
while True:
  msg = new_message("modelV2", valid=frame % 2 == 0, invalidReason="" if frame % 2 == 0 else "odd frame")
  msg.modelV2.frameId = frame
  msg.modelV2.modelName = "small"
  msg.modelV2.position.x = [float(frame)] * 33
  pm.send("modelV2", msg)
  frame += 1
  time.sleep(0.02)
"""

SUBSCRIBE_STATE = """
import json, sys, time
from cereal.messaging import SubMaster
sm = SubMaster(["carState", "deviceState"], poll="carState")
print("ready", flush=True)
speeds, deadline = [], time.monotonic() + 60
while len(speeds) < 5 and time.monotonic() < deadline:
  sm.update(1000)
  if sm.updated["carState"]:
    speeds.append(sm["carState"].vEgo)
print(json.dumps({"speeds": speeds, "device_seen": sm.seen["deviceState"], "malformed": sm.malformed}), flush=True)
"""


def wait_ready(proc):
  line = proc.stdout.readline()
  assert line.strip() == "ready", proc.stderr.read()


def test_submaster_receives_from_a_publisher_process(spawn_python):
  sm = SubMaster(["modelV2"], poll="modelV2")
  child = spawn_python(PUBLISH_MODEL, env={"PYMODELD_PROCESS": "modeld"})
  wait_ready(child)
  frames, reasons, deadline = [], set(), time.monotonic() + 60
  while len(frames) < 6 and time.monotonic() < deadline:
    sm.update(1000)
    if sm.updated["modelV2"]:
      m = sm["modelV2"]
      frames.append(m.frameId)
      assert m.modelName == "small" and m.position.x[0] == float(m.frameId)
      assert sm.valid["modelV2"] == (m.frameId % 2 == 0)
      reasons.add(sm.invalid_reason("modelV2"))
      assert sm.alive["modelV2"]
  assert len(frames) == 6 and frames == sorted(frames), frames
  assert reasons <= {"", "odd frame"}
  assert sm.malformed["modelV2"] == 0
  sm.close()


def test_publisher_process_feeds_several_subscriber_processes(spawn_python):
  children = [spawn_python(SUBSCRIBE_STATE) for _ in range(3)]
  for c in children:
    wait_ready(c)
  pm = PubMaster(["carState", "deviceState"], process="car")
  deadline, speed = time.monotonic() + 60, 0.
  while any(c.poll() is None for c in children) and time.monotonic() < deadline:
    speed += 1.
    msg = new_message("carState")
    msg.carState.vEgo = speed
    pm.send("carState", msg)
    pm.send("deviceState", new_message("deviceState"))
    time.sleep(0.01)
  for c in children:
    out, err = c.communicate(timeout=30)
    report = json.loads(out.strip().splitlines()[-1])
    assert len(report["speeds"]) == 5, err
    assert report["speeds"] == sorted(report["speeds"]) and report["speeds"][0] >= 1.
    assert report["device_seen"] and report["malformed"] == {"carState": 0, "deviceState": 0}
  pm.close()


def test_foreign_publisher_process_is_refused(spawn_python):
  child = spawn_python("""
from cereal.messaging import PubMaster
PubMaster(["modelV2", "carControl"])
""", env={"PYMODELD_PROCESS": "modeld"})
  out, err = child.communicate(timeout=60)
  assert child.returncode != 0
  assert "ServiceOwnershipError" in err and "'carControl'" in err and "'modeld'" in err


def test_recv_helpers():
  sock = sub_sock("carState", timeout=5000)
  pm = PubMaster(["carState"], process="car")
  assert recv_one_or_none(sock) is None
  for v in (1., 2., 3.):
    m = new_message("carState")
    m.carState.vEgo = v
    pm.send("carState", m)
  assert recv_one(sock).carState.vEgo == 1.
  assert [m.carState.vEgo for m in drain_sock(sock)] == [2., 3.]
  for v in (4., 5.):
    m = new_message("carState")
    m.carState.vEgo = v
    pm.send("carState", m)
  assert recv_sock(sock).carState.vEgo == 5.  # newest only
  assert recv_sock(sock) is None
  sock.setTimeout(50)
  assert recv_one(sock) is None
  pm.close()
  sock.close()


def test_conflated_submaster_sees_only_the_newest():
  sm = SubMaster(["carState"])
  pm = PubMaster(["carState"], process="car")
  for v in range(10):
    m = new_message("carState")
    m.carState.vEgo = float(v)
    pm.send("carState", m)
  sm.update(5000)
  assert sm.updated["carState"] and sm["carState"].vEgo == 9.
  sm.update(0)
  assert not sm.updated["carState"]
  pm.close()
  sm.close()


def test_segment_size_comes_from_the_table():
  pm = PubMaster(["modelV2"], process="modeld")
  big = new_message("modelV2")
  big.modelV2.rawPredictions = b"\x01" * (1024 * 1024)  # far above a SMALL queue's limit, fine on BIG
  sock = sub_sock("modelV2", timeout=5000)
  pm.send("modelV2", big)
  assert len(log_from_bytes(sock.receive()).modelV2.rawPredictions) == 1024 * 1024
  assert SERVICE_LIST["modelV2"].queue_size > 3 * 1024 * 1024
  pm.close()
  sock.close()
