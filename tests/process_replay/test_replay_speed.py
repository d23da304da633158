"""What keeps a consumer's replay fast: selfdrived steps 100 times per route second, so its replay is bound by
its launch and by the harness's and the bus's cost per step, not by its own work."""
import os

import pytest

from msgq import fake_event_handle
from process_replay.configs import get_config
from process_replay.harness import ProcessRunner, count_services, in_namespace, load_messages, replay

SLICE_S = 2.0


def _mapped_files(pid: int) -> set[str]:
  with open(f"/proc/{pid}/maps") as f:
    return {line.split(maxsplit=5)[5].strip() for line in f if len(line.split(maxsplit=5)) == 6}


def _loads_numpy(proc: str, route) -> bool:
  """Whether the resident daemon of `proc`, once it has replayed a slice of `route`, has numpy's extension loaded."""
  cfg = get_config(proc)
  with ProcessRunner(cfg) as runner:
    replay(cfg, route, seconds=SLICE_S, runner=runner)
    return any("numpy" in path and path.endswith(".so") for path in _mapped_files(runner.proc.pid))


def test_a_replayed_selfdrived_never_loads_numpy_from_its_launch_to_its_last_step(tici_route):
  """numpy's import is most of a consumer's launch, and selfdrived's replay is launch-bound."""
  assert _loads_numpy("dmonitoringd", tici_route), "the probe must see numpy where a daemon does load it"
  assert not _loads_numpy("selfdrived", tici_route)


def test_every_input_of_a_replayed_daemon_but_its_trigger_has_a_handle_that_never_gates(tici_route):
  """A receive on an endpoint without a handle looks for the handle's file every time; with one it reads a flag."""
  cfg = get_config("selfdrived")
  inputs = [m for m in load_messages(tici_route, SLICE_S) if m.which in cfg.pubs]
  with ProcessRunner(cfg) as runner:
    runner.start(tici_route, inputs)
    with in_namespace(runner._ns.prefix):
      handles = {s: fake_event_handle(s, identifier=cfg.name, override=False) for s in cfg.pubs}
    try:
      assert all(os.path.exists(h.state_path) for h in handles.values())
      assert [s for s, h in handles.items() if h.enabled] == [cfg.main_pub]
    finally:
      for h in handles.values():
        h.close()


@pytest.mark.parametrize("proc", ["selfdrived", "dmonitoringd"])
def test_a_replay_counts_its_outputs_per_service_as_the_decoded_outputs_do(tici_route, proc):
  result = replay(get_config(proc), tici_route, seconds=SLICE_S)
  assert result.counts == count_services(result.outputs) and sum(result.counts.values()) > 0
