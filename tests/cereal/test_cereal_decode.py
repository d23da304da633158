"""log_from_bytes: good messages decode; every kind of malformed bytes raises MessageDecodeError, never aborts."""
import random
import struct

import pytest

from cereal import log
from cereal.messaging import MessageDecodeError, log_from_bytes, new_message
from cereal.services import SERVICE_LIST


def model_bytes() -> bytes:
  msg = new_message("modelV2", valid=False, invalidReason="calibration missing")
  m = msg.modelV2
  m.frameId = 42
  m.modelName = "small"
  m.position.x = [float(i) for i in range(33)]
  for i, line in enumerate(m.init("laneLines", 4)):
    line.y = [float(i)] * 33
  m.init("leadsV3", 3)
  m.rawPredictions = b"\x00\x01" * 100
  return msg.to_bytes()


def test_good_message_decodes():
  r = log_from_bytes(model_bytes(), service="modelV2")
  assert r.which() == "modelV2" and r.modelV2.frameId == 42 and r.modelV2.modelName == "small"
  assert list(r.modelV2.position.x)[:3] == [0., 1., 2.]
  assert r.modelV2.laneLines[3].y[0] == 3. and not r.valid and r.invalidReason == "calibration missing"


@pytest.mark.parametrize("raw", [None, b"", b"\x05" * 3])
def test_data_fields_null_empty_or_set(raw):
  msg = new_message("driverStateV2")
  if raw is not None:
    msg.driverStateV2.rawPredictions = raw
  assert log_from_bytes(msg.to_bytes()).driverStateV2.rawPredictions == (raw or b"")


def test_accepts_any_buffer_type():
  dat = model_bytes()
  assert log_from_bytes(bytearray(dat)).modelV2.frameId == 42
  assert log_from_bytes(memoryview(dat)).modelV2.frameId == 42


def test_decoded_message_survives_many_reads():
  # a message kept in SubMaster.data is re-read every loop; it must not run into a traversal limit later
  r = log_from_bytes(model_bytes())
  for _ in range(20000):
    _ = r.modelV2.laneLines[0].y
  assert r.modelV2.laneLines[0].y[5] == 0.


@pytest.mark.parametrize("dat", [b"", b"\x00" * 7, b"\x00" * 13])
def test_bad_lengths(dat):
  with pytest.raises(MessageDecodeError, match=rf"\({len(dat)} bytes\)"):
    log_from_bytes(dat)


def test_every_truncation_is_caught():
  dat = model_bytes()
  for n in range(8, len(dat), 8):
    with pytest.raises(MessageDecodeError):
      log_from_bytes(dat[:n])


def test_out_of_bounds_root_pointer():
  dat = bytearray(model_bytes())
  root = struct.unpack_from("<Q", dat, 8)[0]
  struct.pack_into("<Q", dat, 8, root | (0x3fff0000 << 2))  # offset far past the segment end
  with pytest.raises(MessageDecodeError, match="out-of-bounds"):
    log_from_bytes(bytes(dat))


def test_error_names_the_service_and_size():
  with pytest.raises(MessageDecodeError) as e:
    log_from_bytes(b"\x01" * 24, service="carState")
  assert e.value.service == "carState" and e.value.size == 24
  assert "'carState'" in str(e.value) and "24 bytes" in str(e.value)
  assert isinstance(e.value, ValueError)


def test_wrong_service_is_rejected():
  with pytest.raises(MessageDecodeError, match="carries 'carState', expected 'modelV2'"):
    log_from_bytes(new_message("carState").to_bytes(), service="modelV2")


def _discriminant_byte() -> int:
  """Where the Event union tag lives: the one byte in which two FrameData services' Events differ."""
  a = new_message("narrowRoadCameraState", logMonoTime=1).to_bytes()
  b = new_message("wideRoadCameraState", logMonoTime=1).to_bytes()
  diff = [i for i in range(len(a)) if a[i] != b[i]]
  assert len(diff) == 1
  return diff[0]


def test_unknown_union_member_from_a_newer_schema():
  i = _discriminant_byte()
  dat = bytearray(new_message("carState").to_bytes())
  dat[i] = 0xfe
  with pytest.raises(MessageDecodeError, match="unknown union member"):
    log_from_bytes(bytes(dat))


def test_unknown_enum_value_is_rejected():
  # consumers compare enums by name (str(sensor), state == "enabled"); a nameless value would raise there
  def frame(sensor):
    m = new_message("narrowRoadCameraState", logMonoTime=1)
    m.narrowRoadCameraState.sensor = sensor
    return m.to_bytes()
  a, b = frame("unknown"), frame("os04c10")
  (i,) = [i for i in range(len(a)) if a[i] != b[i]]
  bad = bytearray(b)
  bad[i] = 0x7f
  with pytest.raises(MessageDecodeError, match="enum field 'sensor'"):
    log_from_bytes(bytes(bad))
  assert log_from_bytes(b).narrowRoadCameraState.sensor == "os04c10"


def _zero_size_list_bomb() -> bytes:
  """A laneLines list claiming 2^28 elements of zero words each: tiny on the wire, huge to traverse."""
  msg = new_message("modelV2", logMonoTime=0)  # no clock value that could look like a pointer
  msg.modelV2.init("laneLines", 1)
  dat = bytearray(msg.to_bytes())
  words = len(dat) // 8
  for i in range(1, words):  # word 0 is the segment table
    w = struct.unpack_from("<Q", dat, 8 * i)[0]
    if w & 3 == 1 and (w >> 32) & 7 == 7:  # a list pointer to an inline-composite list
      tag_index = i + 1 + ((w >> 2) & 0x3fffffff)
      if tag_index >= words:
        continue
      struct.pack_into("<Q", dat, 8 * i, w & 0x7ffffffff)  # list word count 0
      struct.pack_into("<Q", dat, 8 * tag_index, (1 << 28) << 2)  # 2^28 elements, 0 data, 0 pointers
      return bytes(dat)
  raise AssertionError("no composite list pointer found")


def test_traversal_limit_stops_an_amplification_bomb():
  bomb = _zero_size_list_bomb()
  with log.Event.from_bytes(bomb, traversal_limit_in_words=2**63 - 1) as unlimited:
    assert len(unlimited.modelV2.laneLines) == 1 << 28  # without a limit the reader would accept it
  with pytest.raises(MessageDecodeError, match="traversal limit"):
    log_from_bytes(bomb)


def test_random_corruption_only_ever_raises_the_typed_error(fill):
  # every service, every field set; flipped bytes, overwritten words and pure noise
  rng = random.Random(1234)
  originals = []
  for service in sorted(SERVICE_LIST):
    msg = new_message(service)
    fill(getattr(msg, service), 3)
    originals.append(msg.to_bytes())
  outcomes = {"decoded": 0, "rejected": 0}
  for trial in range(600):
    bad = bytearray(rng.choice(originals))
    if trial % 3 == 0:
      for _ in range(rng.randint(1, 6)):
        bad[rng.randrange(len(bad))] = rng.randrange(256)
    elif trial % 3 == 1:
      i = rng.randrange(len(bad) // 8) * 8
      bad[i:i + 8] = rng.randbytes(8)
    else:
      bad = bytearray(rng.randbytes(8 * rng.randint(1, 40)))
    try:
      r = log_from_bytes(bytes(bad))
      r.to_dict()  # a message that passed validation is fully readable
      outcomes["decoded"] += 1
    except MessageDecodeError:
      outcomes["rejected"] += 1
  assert outcomes["rejected"] > 100 and outcomes["decoded"] > 10, outcomes
