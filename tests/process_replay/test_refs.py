"""The shipped references pass: every sample route through every daemon (the model daemons on a slice, the
safety consumers whole), against process_replay/refs. A change that moves any output must regenerate them."""
from process_replay.configs import CONFIGS
from process_replay.references import REFS_DIR
from process_replay.tasks import judge, resolve_routes, run_tasks

MODEL_SLICE_S = 1.0


def test_every_shipped_reference_passes():
  routes = resolve_routes(None)
  assert {r.rsplit("/", 1)[-1] for r in routes} >= {"tici", "mici", "lanechange"}
  consumers = [(r, p) for r in routes for p in ("dmonitoringd", "selfdrived")]
  models = [(r, p) for r in routes for p in sorted(CONFIGS) if p not in ("dmonitoringd", "selfdrived")]
  results = run_tasks(consumers) + run_tasks(models, seconds=MODEL_SLICE_S)
  outcomes = judge(results, REFS_DIR, update=False)
  bad = [(o.result.route, o.result.proc, o.status, o.detail or len(o.diffs)) for o in outcomes if o.status != "PASS"]
  assert bad == []
