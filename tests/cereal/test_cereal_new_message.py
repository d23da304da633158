"""new_message: one clock, valid by default, every service, clear errors."""
import gc
import time

import pytest

from cereal.messaging import UnknownServiceError, log_from_bytes, new_message
from cereal.services import SERVICE_LIST


@pytest.mark.parametrize("service", sorted(SERVICE_LIST))
def test_every_service(service):
  before = time.monotonic_ns()
  msg = new_message(service)
  after = time.monotonic_ns()
  assert msg.which() == service
  assert before <= msg.logMonoTime <= after
  assert msg.valid is True and msg.invalidReason == ""
  r = log_from_bytes(msg.to_bytes(), service=service)
  assert r.which() == service and r.valid and r.logMonoTime == msg.logMonoTime


def test_kwargs_override_envelope_fields():
  msg = new_message("driverStateV2", valid=False, invalidReason="frames dropped", logMonoTime=5)
  assert (msg.valid, msg.invalidReason, msg.logMonoTime) == (False, "frames dropped", 5)


def test_no_service_gives_a_bare_envelope():
  msg = new_message(None, logMonoTime=7)
  assert msg.logMonoTime == 7 and msg.valid


def test_unknown_service_is_named():
  with pytest.raises(UnknownServiceError, match="'roadCameraState'"):
    new_message("roadCameraState")


def test_size_on_a_struct_service_is_a_type_error():
  with pytest.raises(TypeError, match="'modelV2'"):
    new_message("modelV2", 3)


def test_new_message_with_a_text_field_leaves_no_cyclic_garbage():
  gc.collect()
  gc.disable()
  try:
    for _ in range(20):
      new_message("driverStateV2", valid=False, invalidReason="calibration missing")
    assert gc.collect() == 0
  finally:
    gc.enable()
