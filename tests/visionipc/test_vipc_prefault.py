"""Attached buffers are mapped up front (no page faults, no RSS creep on the hot path), unless VIPC_PREFAULT=0."""
import pytest

from visionipc import VISION_STREAM_NARROW_ROAD, VisionIpcClient

FRAME_BYTES = 4804608  # 1928x1208 padded NV12


def resident_shmem_kb() -> int:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("RssShmem:"))


@pytest.mark.parametrize("prefault", ["1", "0"])
def test_a_client_maps_every_page_of_its_buffers_when_it_connects(server_process, monkeypatch, prefault):
  monkeypatch.setenv("VIPC_PREFAULT", prefault)
  server_process().start([(VISION_STREAM_NARROW_ROAD, 4, 1928, 1208, "padded")])
  client = VisionIpcClient("camerad", VISION_STREAM_NARROW_ROAD)
  before = resident_shmem_kb()
  assert client.connect(blocking=True, timeout=30)
  grown_kb = resident_shmem_kb() - before
  if prefault == "1":
    assert grown_kb >= 4 * FRAME_BYTES // 1024, f"only {grown_kb} kB of 4 buffers became resident"
  else:
    assert grown_kb < FRAME_BYTES // 1024, f"{grown_kb} kB resident although nothing was read"
  client.close()
