"""The SubMaster / PubMaster behaviour openpilot's own cereal tests pin (test_pub_sub_master.py), written
here from those semantics against real sockets: bookkeeping dicts, update(timeout_ms), conflation, the
frequency bands at 0.8 / 1.2, and send() taking a builder or bytes. Where we differ on purpose,
cereal/README.md says so (ownership checks in PubMaster, valid=True by default)."""
import gc
import time

import pytest

from cereal.messaging import PubMaster, SubMaster, log_from_bytes, new_message, pub_sock, sub_sock

SERVICES = ["carState", "modelV2", "cameraOdometry", "extrinsicsCalibration", "deviceState"]


@pytest.fixture
def sm_factory():
  made = []

  def make(*args, **kwargs):
    made.append(SubMaster(*args, **kwargs))
    return made[-1]

  yield make
  for sm in made:
    sm.close()


def test_every_per_service_dict_has_one_entry_per_service_and_starts_empty(sm_factory):
  sm = sm_factory(SERVICES)
  for d in (sm.updated, sm.recv_time, sm.recv_frame, sm.alive, sm.freq_ok, sm.sock, sm.data, sm.logMonoTime,
            sm.valid, sm.freq_tracker):
    assert sorted(d) == sorted(SERVICES)
  assert sm.frame == -1
  assert not any(sm.updated.values()) and not any(sm.alive.values()) and not any(sm.valid.values())
  assert set(sm.recv_time.values()) == {0.} and set(sm.recv_frame.values()) == {0}
  assert set(sm.logMonoTime.values()) == {0}


def test_getitem_gives_the_received_message_with_its_time_frame_and_logmonotime(sm_factory):
  pub = pub_sock("carState")
  sm = sm_factory(["carState"])
  msg = new_message("carState")
  msg.carState.vEgo, msg.carState.steeringAngleDeg = 12.5, -3.0
  pub.send(msg.to_bytes())
  before = time.monotonic()
  sm.update(1000)
  assert sm.updated["carState"] and sm.frame == 0 and sm.recv_frame["carState"] == 0
  assert sm["carState"].vEgo == 12.5 and sm["carState"].steeringAngleDeg == -3.0
  assert sm.logMonoTime["carState"] == msg.logMonoTime and before <= sm.recv_time["carState"] <= time.monotonic()
  assert sm.valid["carState"]  # the message's own flag (new_message's default is True)


def test_each_update_advances_frame_and_marks_what_arrived(sm_factory):
  pub = pub_sock("carState")
  sm = sm_factory(["carState"])
  for i in range(10):
    pub.send(new_message("carState").to_bytes())
    sm.update(1000)
    assert sm.frame == i and sm.updated["carState"] and sm.recv_frame["carState"] == i
  sm.update(0)
  assert sm.frame == 10 and not sm.updated["carState"] and sm.recv_frame["carState"] == 9


@pytest.mark.parametrize("timeout_ms", [50, 300])
def test_update_waits_its_timeout_in_ms_when_nothing_arrives(sm_factory, timeout_ms):
  sm = sm_factory(["carState"])
  start = time.monotonic()
  sm.update(timeout_ms)
  elapsed = time.monotonic() - start
  assert elapsed >= timeout_ms / 1000 and elapsed < 5
  assert not any(sm.updated.values()) and sm.frame == 0


def test_a_submaster_always_conflates_to_the_newest_message(sm_factory):
  pub = pub_sock("carState")
  sm = sm_factory(["carState"])
  for i in range(11):
    msg = new_message("carState")
    msg.carState.vEgo = i
    pub.send(msg.to_bytes())
  sm.update(1000)
  assert sm["carState"].vEgo == 10


@pytest.mark.parametrize("poll", [True, False])
def test_frequency_bands_are_openpilots(sm_factory, poll):
  """(max, min) before the 1.2 / 0.8 margins, as openpilot's table has them for the same rates."""
  sm = sm_factory(SERVICES, poll="modelV2" if poll else None, frequency=None if poll else 20.)
  bands = {"carState": (20, 20), "modelV2": (20, 20 if poll else 10), "cameraOdometry": (20, 10),
           "extrinsicsCalibration": (4, 4), "deviceState": (2, 2)}
  for service, (hi, lo) in bands.items():
    assert sm._check_avg_freq(service)
    assert sm.freq_tracker[service].max_freq == pytest.approx(hi * 1.2)
    assert sm.freq_tracker[service].min_freq == pytest.approx(lo * 0.8)


def test_only_services_above_099_hz_are_rate_checked(sm_factory):
  sm = sm_factory(["lateralDelay", "engageRequest", "carState"], ignore_avg_freq=["carState"])
  assert sm._check_avg_freq("lateralDelay")  # 1 Hz: > 0.99, as openpilot has it
  assert not sm._check_avg_freq("engageRequest")  # on demand
  assert not sm._check_avg_freq("carState")  # ignored


@pytest.mark.parametrize("as_builder", [True, False])
def test_pubmaster_send_takes_a_builder_or_bytes_and_they_arrive_unchanged(as_builder):
  services = ["carState", "carControl", "deviceState"]
  pm = PubMaster(services, allow_foreign=True)
  subs = {s: sub_sock(s, conflate=True, timeout=1000) for s in services}
  for i in range(30):
    s = services[i % len(services)]
    msg = new_message(s)
    if as_builder:
      pm.send(s, msg)
      msg.clear_write_flag()
      sent = msg.to_bytes()
    else:
      sent = msg.to_bytes()
      pm.send(s, sent)
    assert subs[s].receive() == sent, i
  assert log_from_bytes(sent).which() == services[29 % 3]
  pm.close()


@pytest.mark.parametrize("drop", ["close", "del", "garbage cycle"])
def test_a_dropped_pubmaster_releases_its_services_for_the_next_one(drop):
  gc.disable()
  try:
    pm = PubMaster(["carState"], process="car")
    if drop == "close":
      pm.close()
    elif drop == "garbage cycle":
      pm.cycle = pm
    del pm
    again = PubMaster(["carState"], process="car")
    again.send("carState", new_message("carState"))
    again.close()
  finally:
    gc.enable()
