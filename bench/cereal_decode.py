#!/usr/bin/env python3
"""Decode cost of cereal.messaging.log_from_bytes (validated up front) against its peers, in one run.

Peers: plain pycapnp `from_bytes` (what openpilot's log_from_bytes does: lazy, no validation, no limit),
`to_dict()` (an eager full read, the obvious other way to validate) and `str()` (capnp's C++ pretty
printer, which also walks everything). Messages are shaped like the real ones (modelV2 ~8 KB).

  python -m bench.cereal_decode [--count N]
"""
import argparse
import statistics
import time


from bench.results import record  # noqa: E402
from cereal import log  # noqa: E402
from cereal.messaging import log_from_bytes, new_message  # noqa: E402


def xyzt(b, n=33, stds=True):
  for f in ("x", "y", "z", "t") + (("xStd", "yStd", "zStd") if stds else ()):
    setattr(b, f, [0.1 * i for i in range(n)])


def model_v2() -> bytes:
  msg = new_message("modelV2")
  m = msg.modelV2
  for f in ("position", "orientation", "velocity", "orientationRate", "acceleration"):
    xyzt(getattr(m, f), stds=f == "position")
  for line in m.init("laneLines", 4):
    xyzt(line, stds=False)
  for edge in m.init("roadEdges", 2):
    xyzt(edge, stds=False)
  m.laneLineProbs = m.laneLineStds = [0.5] * 4
  m.roadEdgeStds = [0.5] * 2
  for lead in m.init("leadsV3", 3):
    for f in ("t", "x", "y", "v", "a", "xStd", "yStd", "vStd"):
      setattr(lead, f, [1.0] * 6)
  m.meta.desireState = [0.] * 8
  m.meta.desirePrediction = [0.] * 32
  d = m.meta.disengagePredictions
  for f in ("t", "brakeDisengageProbs", "gasDisengageProbs", "steerOverrideProbs",
            "brake3MetersPerSecondSquaredProbs", "brake4MetersPerSecondSquaredProbs",
            "brake5MetersPerSecondSquaredProbs"):
    setattr(d, f, [0.1] * 5)
  d.gasPressProbs = d.brakePressProbs = [0.1] * 6
  m.modelName = "small"
  return msg.to_bytes()


def driver_state_v2() -> bytes:
  msg = new_message("driverStateV2")
  for side in (msg.driverStateV2.leftDriverData, msg.driverStateV2.rightDriverData):
    side.faceOrientation = side.faceOrientationStd = side.facePosition = side.facePositionStd = [0.1] * 3
    side.faceProb = 0.9
  return msg.to_bytes()


def car_state() -> bytes:
  msg = new_message("carState")
  msg.carState.vEgo = 20.
  return msg.to_bytes()


def raw_from_bytes(dat: bytes):
  with log.Event.from_bytes(dat, traversal_limit_in_words=2**63 - 1) as msg:
    return msg


def to_dict(dat: bytes):
  return raw_from_bytes(dat).to_dict()


def pretty(dat: bytes):
  return str(raw_from_bytes(dat))


def median_us(fn, dat: bytes, count: int) -> float:
  samples = []
  for _ in range(count):
    t = time.perf_counter()
    fn(dat)
    samples.append(time.perf_counter() - t)
  return statistics.median(samples) * 1e6


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--count", type=int, default=2000)
  args = ap.parse_args()
  ways = [("pycapnp from_bytes", raw_from_bytes), ("log_from_bytes (ours)", log_from_bytes),
          ("to_dict", to_dict), ("str()", pretty)]
  print(f"{'message':<16}{'bytes':>7}  " + "".join(f"{name:>24}" for name, _ in ways) + "   µs median (ratio to ours)")
  figures = {}
  for name, dat in (("modelV2", model_v2()), ("driverStateV2", driver_state_v2()), ("carState", car_state())):
    times = [median_us(fn, dat, args.count) for _, fn in ways]
    ours = times[1]
    cells = "".join(f"{f'{t:.1f} ({t / ours:.2f}x)':>24}" for t in times)
    print(f"{name:<16}{len(dat):>7}  {cells}")
    figures[name] = {"bytes": len(dat), **{way: round(t, 2) for (way, _), t in zip(ways, times)}}
  print(f"recorded in {record('cereal_decode', {'median_us': figures})}")


if __name__ == "__main__":
  main()
