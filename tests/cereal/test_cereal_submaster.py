"""SubMaster state rules (openpilot's) driven by an injected clock, on real sockets."""
import pytest

from cereal.messaging import MessageDecodeError, PubMaster, SubMaster, UnknownServiceError, new_message, pub_sock


class Clock:
  def __init__(self, t: float = 1000.0):
    self.t = t

  def __call__(self) -> float:
    return self.t


def msg(service: str, valid: bool = True, reason: str = "", **fields):
  m = new_message(service, valid=valid, invalidReason=reason)
  for k, v in fields.items():
    setattr(getattr(m, service), k, v)
  return m.as_reader()


@pytest.fixture
def make_sm():
  made = []

  def make(*args, **kwargs):
    sm = SubMaster(*args, **kwargs)
    made.append(sm)
    return sm

  yield make
  for sm in made:
    sm.close()


def test_initial_state(make_sm):
  sm = make_sm(["carState", "engageRequest"])
  assert sm.frame == -1
  for d in (sm.alive, sm.freq_ok, sm.valid):
    assert d == {"carState": False, "engageRequest": True}  # on-demand services start good
  assert sm.seen == sm.updated == {"carState": False, "engageRequest": False}
  assert sm["carState"].vEgo == 0. and sm.recv_frame["carState"] == 0 and sm.logMonoTime["carState"] == 0


def test_alive_is_younger_than_ten_periods(make_sm):
  sm = make_sm(["extrinsicsCalibration"])  # 4 Hz: ten periods = 2.5 s exactly
  sm.update_msgs(8.0, [msg("extrinsicsCalibration")])
  assert sm.alive["extrinsicsCalibration"]
  sm.update_msgs(10.49, [])
  assert sm.alive["extrinsicsCalibration"]
  sm.update_msgs(10.5, [])  # strictly younger than 10 periods
  assert not sm.alive["extrinsicsCalibration"]
  sm.update_msgs(10.6, [msg("extrinsicsCalibration")])
  assert sm.alive["extrinsicsCalibration"]


def test_on_demand_service_is_never_judged(make_sm):
  sm = make_sm(["engageRequest"])
  sm.update_msgs(1.0, [msg("engageRequest", engage=True)])
  sm.update_msgs(1e6, [])
  assert sm.alive["engageRequest"] and sm.freq_ok["engageRequest"] and sm.all_checks()
  sm.update_msgs(1e6 + 1, [msg("engageRequest", valid=False, reason="stub says so")])
  assert not sm.valid["engageRequest"] and not sm.all_checks()  # valid still follows messages


def test_valid_follows_the_message_and_keeps_its_reason(make_sm):
  sm = make_sm(["modelV2"])
  sm.update_msgs(1.0, [msg("modelV2", valid=False, reason="calibration missing")])
  assert not sm.valid["modelV2"] and sm.invalid_reason("modelV2") == "calibration missing"
  sm.update_msgs(1.05, [msg("modelV2")])
  assert sm.valid["modelV2"] and sm.invalid_reason("modelV2") == ""


def test_frame_updated_seen_and_recv_bookkeeping(make_sm):
  sm = make_sm(["carState", "modelV2"])
  sm.update_msgs(1.0, [msg("carState", vEgo=3.5)])
  assert sm.frame == 0 and sm.updated == {"carState": True, "modelV2": False}
  sm.update_msgs(1.01, [None])
  assert sm.frame == 1 and not any(sm.updated.values()) and sm.seen["carState"] and not sm.seen["modelV2"]
  assert sm.recv_frame["carState"] == 0 and sm.recv_time["carState"] == 1.0 and sm["carState"].vEgo == 3.5


def test_freq_ok_for_the_polled_service(make_sm):
  sm = make_sm(["modelV2"], poll="modelV2")  # 20 Hz, band [16, 24]
  t = 0.0
  for _ in range(30):
    t += 1 / 20
    sm.update_msgs(t, [msg("modelV2")])
  assert sm.freq_ok["modelV2"] and sm.all_checks()
  for _ in range(250):
    t += 1 / 15
    sm.update_msgs(t, [msg("modelV2")])
  assert sm.alive["modelV2"] and not sm.freq_ok["modelV2"]
  assert not sm.all_freq_ok() and not sm.all_checks() and sm.all_alive() and sm.all_valid()
  assert sm.failures() == ["modelV2: frequency out of range"]


def test_update_rate_comes_from_the_polled_service_or_frequency(make_sm):
  sm = make_sm(["modelV2", "carState"], poll="modelV2")
  assert sm.update_freq == 20. and sm.non_polled_services == ["carState"]
  assert (sm.freq_tracker["carState"].min_freq, sm.freq_tracker["carState"].max_freq) == pytest.approx((16., 24.))
  sm = make_sm(["driverStateV2", "lateralDelay"], frequency=30.)
  assert sm.update_freq == 30. and sm.non_polled_services == []
  assert sm.freq_tracker["driverStateV2"].min_freq == pytest.approx(8.)   # f / 2 branch
  sm = make_sm(["carState", "driverStateV2"])
  assert sm.update_freq == 100.


def test_aggregates_and_ignore_lists(make_sm):
  services = ["modelV2", "carState", "lateralDelay", "engageRequest"]
  sm = make_sm(services, ignore_alive=["carState"], ignore_avg_freq=["modelV2"], ignore_valid=["lateralDelay"])
  sm.update_msgs(1.0, [msg("modelV2"), msg("lateralDelay", valid=False)])
  # carState: never received, but ignored for alive and (hence) for frequency; valid still counts
  assert sm.all_alive() and not sm.all_valid()
  assert sm.all_valid(["modelV2", "lateralDelay"])  # lateralDelay's valid is ignored
  # modelV2 freq ignored; lateralDelay (1 Hz > 0.99) has one arrival only: not ok yet
  assert not sm.all_freq_ok() and sm.all_freq_ok(["modelV2", "engageRequest", "carState"])
  assert set(sm.failures()) == {"carState: invalid (no message yet)", "lateralDelay: frequency out of range"}


def test_simulation_relaxes_alive_and_freq(make_sm, monkeypatch):
  monkeypatch.setenv("SIMULATION", "1")
  sm = make_sm(["carState"])
  sm.update_msgs(1.0, [msg("carState")])
  sm.update_msgs(500.0, [])
  assert sm.alive["carState"] and sm.freq_ok["carState"]


def test_constructor_errors(make_sm):
  with pytest.raises(UnknownServiceError, match="'roadCameraState'"):
    make_sm(["roadCameraState"])
  with pytest.raises(ValueError, match="poll='carState'"):
    make_sm(["modelV2"], poll="carState")
  with pytest.raises(ValueError, match="poll="):
    make_sm(["modelV2"], poll=["modelV2"])
  with pytest.raises(ValueError, match="frequency=20"):
    make_sm(["modelV2"], poll="modelV2", frequency=20)
  with pytest.raises(ValueError, match="frequency=-5"):
    make_sm(["modelV2"], frequency=-5)
  with pytest.raises(ValueError, match="ignore_alive names 'carState'"):
    make_sm(["modelV2"], ignore_alive=["carState"])
  with pytest.raises(UnknownServiceError, match="'carstate'"):
    make_sm(["modelV2"], ignore_valid=["carstate"])


def test_update_uses_the_injected_clock(make_sm):
  clock = Clock(50.0)
  sm = make_sm(["carState"], clock=clock)
  pm = PubMaster(["carState"], allow_foreign=True)
  pm.send("carState", new_message("carState"))
  sm.update(5000)
  assert sm.updated["carState"] and sm.recv_time["carState"] == 50.0 and sm.alive["carState"]
  clock.t = 50.0 + 0.1
  sm.update(0)
  assert not sm.alive["carState"]
  pm.close()


def test_malformed_and_foreign_messages_are_counted_and_skipped(make_sm):
  sm = make_sm(["carState", "modelV2"], poll="carState")
  raw = pub_sock("carState")
  good = new_message("carState")
  good.carState.vEgo = 12.5
  good = good.to_bytes()
  raw.send(good[:-8])                     # truncated
  sm.update(5000)
  raw.send(b"\x07" * 24)                             # garbage
  sm.update(5000)
  raw.send(new_message("modelV2").to_bytes())        # another service's message on this socket
  sm.update(5000)
  raw.send(b"")                                      # zero-length (legal on the bus, not a message)
  sm.update(5000)
  assert sm.malformed == {"carState": 4, "modelV2": 0}
  assert isinstance(sm.decode_error["carState"], MessageDecodeError)
  assert not sm.seen["carState"] and sm.frame == 3
  raw.send(good)
  sm.update(5000)
  assert sm.updated["carState"] and sm["carState"].vEgo == 12.5 and sm.malformed["carState"] == 4
  raw.close()
