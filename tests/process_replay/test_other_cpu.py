"""Replay on another CPU: the shipped references were made on one x86-64 CPU; the generated kernels compiled
for another ISA level (PYMODELD_CPU_TARGET, and OpenBLAS told to use that level's kernels) round and sum
differently, and the model's floats move by ~1e-6. The DM model per process and the whole chain still match the
references: the model's floats and their consumers' floats at the model tolerance, every discrete field exactly."""
import platform

import pytest

from cereal import messaging
from process_replay.compare import compare_logs
from process_replay.configs import CHAIN, CONSUMER_TOLERANCE, MODEL_TOLERANCE, get_config
from process_replay.references import REFS_DIR
from process_replay.tasks import judge, run_tasks
from runtime import compiler, config
from runtime.cache import kernel_key

SECONDS = 2.0
# x86-64-v2 (SSE4.2, no AVX or FMA) differs from any AVX2/AVX-512 machine's -march=native in vector width and
# in contraction to FMA; Nehalem is OpenBLAS's kernel set of that level
OTHER_CPU = {"PYMODELD_CPU_TARGET": "x86-64-v2", "OPENBLAS_CORETYPE": "Nehalem"}


def _host_runs_x86_64_v2() -> bool:
  if platform.machine() not in ("x86_64", "AMD64"):
    return False
  try:
    with open("/proc/cpuinfo") as f:
      flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
  except OSError:
    return False
  return {"sse4_2", "popcnt", "ssse3", "cx16"} <= set(flags)


@pytest.mark.skipif(not _host_runs_x86_64_v2(), reason="standing in for another CPU needs an x86-64-v2 host")
@pytest.mark.parametrize("proc", ["dmonitoringmodeld", "chain"])
def test_the_shipped_references_hold_when_the_kernels_are_built_for_another_isa_level(tici_route_path, proc):
  results = run_tasks([(tici_route_path, proc)], jobs=1, seconds=SECONDS, env=OTHER_CPU)
  [outcome] = judge(results, REFS_DIR, update=False)
  assert outcome.status == "PASS", (outcome.detail, outcome.diffs[:5])


def test_the_consumers_follow_the_model_tolerance_and_keep_their_discrete_fields_exact():
  for name in CHAIN:
    assert get_config(name).tolerance == (MODEL_TOLERANCE if name in ("modeld", "dmonitoringmodeld") else CONSUMER_TOLERANCE)
  assert CONSUMER_TOLERANCE == MODEL_TOLERANCE
  ref = [_state(yaw=0.7617620229721069, level="two")]
  assert compare_logs(ref, [_state(yaw=0.7617628574371338, level="two")], ignore=("logMonoTime",), tolerance=CONSUMER_TOLERANCE) == []
  diffs = compare_logs(ref, [_state(yaw=0.7617620229721069, level="three")], ignore=("logMonoTime",), tolerance=CONSUMER_TOLERANCE)
  assert [(d.kind, d.path) for d in diffs] == [("change", "driverMonitoringState.alertLevel")]
  far = compare_logs(ref, [_state(yaw=0.77, level="two")], ignore=("logMonoTime",), tolerance=CONSUMER_TOLERANCE)   # a changed rule or input
  assert [d.path for d in far] == ["driverMonitoringState.visionPolicyState.pose.yaw"]


def _state(yaw: float, level: str) -> bytes:
  msg = messaging.new_message("driverMonitoringState")
  msg.driverMonitoringState.visionPolicyState.pose.yaw = yaw
  msg.driverMonitoringState.alertLevel = level
  return msg.to_bytes()


def test_the_forced_isa_level_is_in_the_compiler_flags_and_the_kernel_cache_key(monkeypatch):
  monkeypatch.delenv(config.CPU_TARGET_ENV, raising=False)
  native_flags, native_key = compiler.flags(), kernel_key("void k_0(void) {}", "CPU:C")
  monkeypatch.setenv(config.CPU_TARGET_ENV, "x86-64-v3")
  assert "-march=x86-64-v3" in compiler.flags() and "-march=x86-64-v3" not in native_flags
  assert compiler.vector_bytes() == 32 and kernel_key("void k_0(void) {}", "CPU:C") != native_key
  monkeypatch.setenv(config.CPU_TARGET_ENV, "x86-64-v2")
  assert compiler.vector_bytes() == 16 and "-march=x86-64-v2" in compiler.flags()
  monkeypatch.setenv(config.CPU_TARGET_ENV, "pentium4")
  with pytest.raises(ValueError, match="PYMODELD_CPU_TARGET must be one of x86-64, x86-64-v2"):
    compiler.flags()
