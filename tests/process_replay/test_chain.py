"""Chain replay: frames through modeld and dmonitoringmodeld into dmonitoringd and selfdrived, each daemon on
the others' replayed outputs; byte-identical run after run and with -j 1 or -j 2, equal to the shipped chain
references, and a daemon that dies or stalls mid-chain is a ReplayError naming it."""
import dataclasses
import os
import signal

import pytest

from cereal.messaging import log_from_bytes
from cereal.route import Route
from process_replay.chain import replay_chain
from process_replay.compare import normalized_bytes
from process_replay.configs import CHAIN, get_config, owner_of
from process_replay.harness import ProcessRunner, ReplayError
from process_replay.references import REFS_DIR
from process_replay.tasks import judge, run_tasks

SECONDS = 2.0
IGNORE = tuple(p for name in CHAIN for p in get_config(name).ignore)


def norm(outputs):
  return [normalized_bytes(d, IGNORE) for d in outputs]


@pytest.fixture(scope="module")
def tici_chain(tici_route_path):
  with Route(tici_route_path) as route:
    return replay_chain(route, seconds=SECONDS)


def test_each_daemon_runs_on_the_others_replayed_outputs(tici_chain, tici_route_path):
  by_service = {}
  for d in tici_chain.outputs:
    evt = log_from_bytes(d)
    by_service.setdefault(evt.which(), []).append(evt)
  assert {owner_of(s) for s in by_service} == set(CHAIN)
  assert tici_chain.steps == {"modeld": 40, "dmonitoringmodeld": 40, "dmonitoringd": 40, "selfdrived": 200}
  # dmonitoringd stepped on the replayed driverStateV2: one state per replayed model output, 1 ms after it
  ds = [e.logMonoTime for e in by_service["driverStateV2"]]
  dms = [e.logMonoTime for e in by_service["driverMonitoringState"]]
  assert [t + 1_000_000 for t in ds] == dms
  times = [log_from_bytes(d).logMonoTime for d in tici_chain.outputs]
  assert times == sorted(times)


def test_chain_is_byte_identical_run_after_run(tici_chain, tici_route_path):
  with Route(tici_route_path) as route:
    again = replay_chain(route, seconds=SECONDS)
  assert norm(again.outputs) == norm(tici_chain.outputs)


def test_chain_with_one_or_two_jobs_is_the_same_and_matches_the_shipped_references(tici_route_path, mici_route_path):
  tasks = [(tici_route_path, "chain"), (mici_route_path, "chain")]
  one = run_tasks(tasks, jobs=1, seconds=SECONDS)
  two = run_tasks(tasks, jobs=2, seconds=SECONDS)
  assert [r.error for r in one + two] == [""] * 4
  for a, b in zip(one, two):
    assert a.outputs and norm(a.outputs) == norm(b.outputs)
  outcomes = judge(one, REFS_DIR, update=False)
  assert [(o.status, len(o.diffs)) for o in outcomes] == [("PASS", 0), ("PASS", 0)], [o.detail for o in outcomes]


@pytest.mark.parametrize("victim,sig,message", [
  ("dmonitoringd", signal.SIGKILL, r"dmonitoringd exited with code -9 at step \d+"),
  ("modeld", signal.SIGSTOP, r"modeld hung: no gated receive .* within 3 s at step \d+"),
])
def test_a_daemon_that_dies_or_stalls_mid_chain_is_named(tici_route_path, victim, sig, message):
  runners = {name: ProcessRunner(get_config(name)) for name in CHAIN}
  runners[victim].cfg = dataclasses.replace(runners[victim].cfg, timeout=3.0)

  def strike(done, total):
    if done == 500:
      os.kill(runners[victim].proc.pid, sig)

  try:
    with Route(tici_route_path) as route:
      with pytest.raises(ReplayError, match=message):
        replay_chain(route, seconds=SECONDS, runners=runners, on_event=strike)
    assert all(r.proc is None or r.proc.poll() is not None for r in runners.values())   # all stopped
  finally:
    for r in runners.values():
      r.stop()
