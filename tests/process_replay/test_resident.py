"""Resident daemons: one process replays route after route; ending main() between routes resets it, so
replaying A, B, A gives A's bytes twice (for every daemon: the reset is the daemon's whole main()). B is the
mici route (another camera geometry), for selfdrived the tici route without its engage requests (the sample
routes' selfdrived inputs are otherwise alike)."""
import pytest

from cereal.route import Route
from process_replay.compare import normalized_bytes
from process_replay.configs import CONFIGS, get_config
from process_replay.harness import ProcessRunner, load_messages, replay

SECONDS = {"dmonitoringmodeld": 1.0, "modeld": 0.6, "dmonitoringd": 5.0, "selfdrived": 5.0}


@pytest.mark.parametrize("proc", sorted(CONFIGS))
def test_a_b_a_in_one_resident_gives_a_twice(tici_route_path, mici_route_path, proc):
  cfg = get_config(proc)
  runner = ProcessRunner(cfg)
  runner.launch()
  try:
    with Route(tici_route_path) as a, Route(mici_route_path if proc != "selfdrived" else tici_route_path) as b:
      b_msgs = load_messages(b, SECONDS[proc])
      if proc == "selfdrived":
        b_msgs = [m for m in b_msgs if m.which != "engageRequest"]
      first = replay(cfg, a, seconds=SECONDS[proc], runner=runner)
      pid = runner.proc.pid
      other = replay(cfg, b, messages=b_msgs, runner=runner)
      again = replay(cfg, a, seconds=SECONDS[proc], runner=runner)
    assert runner.proc.pid == pid and runner.routes == 3 and runner.proc.poll() is None   # one process throughout
  finally:
    runner.stop()
  norm = lambda r: [normalized_bytes(d, cfg.ignore) for d in r.outputs]
  assert first.outputs and norm(first) == norm(again)
  assert norm(other) != norm(first)
