"""Which calls lead from the frame loop to the linked program: the tests that pin a frame's path read it here."""
import sys

import runtime.link


def record_linked_runs(monkeypatch) -> list:
  """Every later Linked.run appends (the Linked, the qualified names of its callers from run_frame_loop down)."""
  callers = []
  real_run = runtime.link.Linked.run

  def noting_run(self, *a, **k):
    f, chain = sys._getframe(1), []
    while f is not None and (not chain or chain[-1] != "run_frame_loop"):
      chain.append(f.f_code.co_qualname)
      f = f.f_back
    callers.append((self, chain[::-1]))
    return real_run(self, *a, **k)
  monkeypatch.setattr(runtime.link.Linked, "run", noting_run)
  return callers
