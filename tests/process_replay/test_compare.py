"""compare: tolerance (absolute and relative), NaN, counts, type and length changes, enums, ignore paths."""
import math

import pytest

from cereal.messaging import new_message
from process_replay.compare import check_ignore_field, compare_logs, differing_fields, floats_match, format_diff, normalized_bytes


def ds(face_prob=0.5, orientation=(0.1, 0.2, 0.3), model_ms=1.0, t=1000):
  msg = new_message("driverStateV2")
  msg.logMonoTime = t
  d = msg.driverStateV2
  d.leftDriverData.faceProb = face_prob
  d.leftDriverData.faceOrientation = list(orientation)
  d.stageTimings.modelMs = model_ms
  d.modelExecutionTime = model_ms / 1000
  return msg.to_bytes()


def dm(level="none", t=1000):
  msg = new_message("driverMonitoringState")
  msg.logMonoTime = t
  msg.driverMonitoringState.alertLevel = level
  return msg.to_bytes()


def test_identical_logs_match():
  log = [ds(), dm(), ds(0.7)]
  assert compare_logs(log, list(log)) == []


def test_exact_comparison_without_tolerance_names_the_field():
  diffs = compare_logs([ds(0.5)], [ds(0.5000001)])
  assert [(d.kind, d.path, d.index) for d in diffs] == [("change", "driverStateV2.leftDriverData.faceProb", 0)]


def test_absolute_and_relative_tolerance():
  assert floats_match(1000.0, 1000.0625, 1e-4)          # relative: 1e-4 * 1000 = 0.1
  assert not floats_match(1000.0, 1000.0625, 1e-5)      # 1e-5 * 1000 = 0.01 < 0.0625
  assert floats_match(0.0, 1e-6, 1e-5)                  # absolute part: near zero the relative one is useless
  assert not floats_match(0.0, 1e-6, None)
  assert compare_logs([ds(0.5)], [ds(0.5000001)], tolerance=1e-6) == []


def test_nan_is_handled_explicitly():
  nan = float("nan")
  assert floats_match(nan, nan)
  assert not floats_match(nan, nan, nan_equal=False)
  assert not floats_match(nan, 1.0) and not floats_match(1.0, nan, tolerance=10.0)
  assert not floats_match(math.inf, 1e308, tolerance=1.0)
  assert compare_logs([ds(nan)], [ds(nan)]) == []
  diffs = compare_logs([ds(nan)], [ds(0.5)])
  assert [d.path for d in diffs] == ["driverStateV2.leftDriverData.faceProb"]
  assert len(compare_logs([ds(nan)], [ds(nan)], nan_equal=False)) == 1


def test_different_counts_are_reported_and_the_prefix_still_compared():
  diffs = compare_logs([ds(0.1), ds(0.2), ds(0.3)], [ds(0.1), ds(0.25)])
  kinds = {(d.kind, d.path) for d in diffs}
  assert ("count", "driverStateV2") in kinds
  count = next(d for d in diffs if d.kind == "count")
  assert (count.ref, count.new) == (3, 2)
  assert ("change", "driverStateV2.leftDriverData.faceProb") in kinds


def test_message_type_change_is_reported():
  diffs = compare_logs([ds(), dm()], [ds(), ds()])
  types = [d for d in diffs if d.kind == "type"]
  assert [(d.path, d.index, d.ref, d.new) for d in types] == [("which", 1, "driverMonitoringState", "driverStateV2")]
  assert {(d.path, d.ref, d.new) for d in diffs if d.kind == "count"} == {
    ("driverMonitoringState", 1, 0), ("driverStateV2", 1, 2)}


def test_list_length_and_elements():
  diffs = compare_logs([ds(orientation=(0.1, 0.2, 0.3))], [ds(orientation=(0.1, 0.5))])
  assert {(d.kind, d.path) for d in diffs} == {
    ("length", "driverStateV2.leftDriverData.faceOrientation"),
    ("change", "driverStateV2.leftDriverData.faceOrientation.1")}


def test_enums_compare_by_name():
  diffs = compare_logs([dm("one")], [dm("two")])
  assert [(d.path, d.ref, d.new) for d in diffs] == [("driverMonitoringState.alertLevel", "one", "two")]


def test_ignore_paths_hide_whole_subtrees_and_log_mono_time():
  a, b = ds(model_ms=1.0, t=1), ds(model_ms=9.0, t=2)
  ignore = ("logMonoTime", "driverStateV2.stageTimings", "driverStateV2.modelExecutionTime")
  assert compare_logs([a], [b], ignore) == []
  assert normalized_bytes(a, ignore) == normalized_bytes(b, ignore)
  assert set(differing_fields(compare_logs([a], [b]))) == {
    "logMonoTime", "driverStateV2.stageTimings.modelMs", "driverStateV2.modelExecutionTime"}
  # a path of another service does not touch this one
  assert normalized_bytes(a, ("driverMonitoringState.alertLevel",)) == normalized_bytes(a)


def test_format_groups_list_elements_and_lists_every_field():
  diffs = compare_logs([ds(0.1, (1, 2, 3)), ds(0.1, (1, 2, 3))], [ds(0.2, (1, 5, 6)), ds(0.1, (1, 2, 7))])
  text = format_diff(diffs, "tici/dmonitoringmodeld")
  assert "driverStateV2.leftDriverData.faceOrientation.[]: 3" in text
  assert "driverStateV2.leftDriverData.faceProb: 1" in text
  assert text.startswith("tici/dmonitoringmodeld: 4 differences in 2 fields")


@pytest.mark.parametrize("a,b", [(1.0, 1.0), (-0.0, 0.0)])
def test_equal_floats_always_match(a, b):
  assert floats_match(a, b, None)


def test_an_ignore_path_with_brackets_hides_that_field_in_every_list_element():
  a, b = ds(orientation=(0.1, 0.2, 0.3)), ds(orientation=(0.9, 0.8, 0.7))
  assert len(compare_logs([a], [b])) == 3
  assert compare_logs([a], [b], ["driverStateV2.leftDriverData.faceOrientation.[]"]) == []


def test_ignored_services_count_in_neither_the_messages_nor_their_log_positions():
  ref, new = [ds(), dm("one"), ds()], [ds(), ds(), dm("two"), dm("three")]
  assert {d.kind for d in compare_logs(ref, new)} == {"type", "count", "change"}
  assert compare_logs(ref, new, ignore_msgs=["driverMonitoringState"]) == []


@pytest.mark.parametrize("path,message", [
  ("driverStateV2.leftDriverData.faceProbb", "driverStateV2.leftDriverData has no field 'faceProbb' (did you mean "
                                             "driverStateV2.leftDriverData.faceProb"),
  ("drivrStateV2.leftDriverData", "the Event has no service or field 'drivrStateV2' (did you mean driverStateV2"),
  ("driverStateV2.leftDriverData.faceOrientation.x", "faceOrientation is a list; name an element by its index or every one by []"),
  ("driverStateV2.leftDriverData.faceProb.x", "faceProb is a single float32 value, it has no part 'x'"),
  ("driverStateV2", "'driverStateV2' is a whole service: leave it out with --ignore-msgs driverStateV2"),
])
def test_an_ignore_path_that_names_no_field_is_refused_with_the_part_that_does_not_resolve(path, message):
  with pytest.raises(ValueError) as e:
    check_ignore_field(path)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_an_ignore_path_through_a_list_of_structs_drops_that_field_of_every_element():
  def model(*probs):
    msg = new_message("modelV2")
    msg.logMonoTime = 1000
    leads = msg.modelV2.init("leadsV3", len(probs))
    for lead, p in zip(leads, probs):
      lead.prob, lead.probTime = p, 2.0
    return msg.to_bytes()
  path = "modelV2.leadsV3.[].prob"
  assert [d.path for d in compare_logs([model(0.1, 0.2)], [model(0.3, 0.4)])] == ["modelV2.leadsV3.0.prob", "modelV2.leadsV3.1.prob"]
  assert compare_logs([model(0.1, 0.2)], [model(0.3, 0.4)], [path]) == []
  assert normalized_bytes(model(0.1, 0.2), [path]) == normalized_bytes(model(0.3, 0.4), [path])
