"""A VisionIpcServer that is closed, deleted or collected releases its control socket and announcement
endpoints at once, so the next server of the same name starts in the same process (commaai/msgq's own suite
makes a new VisionIpcServer("camerad") in every test and just drops the last one)."""
import gc

import numpy as np
import pytest

from visionipc import GeometryError, VisionIpcClient, VisionIpcServer, get_nv12_info


def _serve(name: str = "camerad", *create_args) -> VisionIpcServer:
  server = VisionIpcServer(name)
  server.create_buffers(0, 2, *(create_args or (64, 48)))
  server.start_listener()
  return server


def _round_trip(server: VisionIpcServer, frame_id: int) -> None:
  client = VisionIpcClient("camerad", 0)
  assert client.connect(True, timeout=10)
  server.send(0, np.full(client.buffer_len, frame_id, np.uint8), frame_id)
  buf = client.recv(5000)
  assert buf is not None and buf.frame_id == frame_id and buf.data[0] == frame_id
  client.close()


@pytest.mark.parametrize("drop", ["close", "del", "garbage cycle"])
def test_a_dropped_server_frees_its_name_for_the_next_one_at_once(drop):
  gc.disable()  # nothing but the drop itself may free the old server
  try:
    server = _serve()
    _round_trip(server, 1)
    if drop == "close":
      server.close()
    elif drop == "garbage cycle":
      server.cycle = server
    del server
    new = _serve()
    _round_trip(new, 2)
    new.close()
  finally:
    gc.enable()


def test_a_live_server_of_the_same_name_still_refuses_a_second():
  server = _serve()
  with pytest.raises(Exception, match="already"):
    _serve()
  _round_trip(server, 3)
  server.close()


def test_create_buffers_takes_the_references_four_and_openpilots_older_five_arguments():
  server = VisionIpcServer("camerad")
  server.create_buffers(0, 2, 100, 200)                 # commaai/msgq: stream, num_buffers, width, height
  server.create_buffers(2, 2, False, 1928, 1208)        # openpilot's older: ..., rgb, width, height
  with pytest.raises(GeometryError, match="RGB buffers are not served"):
    server.create_buffers(1, 2, True, 64, 48)
  with pytest.raises(TypeError, match="create_buffers"):
    server.create_buffers(1, 2, 64)
  server.start_listener()
  client = VisionIpcClient("camerad", 2)
  assert client.connect(True, timeout=10)
  stride, y_height, _, size = get_nv12_info(1928, 1208)
  assert (client.width, client.height, client.buffer_len) == (1928, 1208, 1928 * 1208 * 3 // 2)
  assert (stride, size) == (2048, 4804608)  # the padded layout stays create_buffers_with_sizes'
  client.close()
  server.close()
