"""log.capnp: every service round-trips with every field set; the fields other packages code against exist."""
import pytest

from cereal import log
from cereal.services import SERVICE_LIST

SERVICES = sorted(SERVICE_LIST)


def test_event_union_is_exactly_the_services_table():
  assert set(log.Event.schema.union_fields) == set(SERVICE_LIST)


@pytest.mark.parametrize("service", SERVICES)
def test_every_field_of_every_service_round_trips(service, fill):
  msg = log.Event.new_message(logMonoTime=123456789, valid=False, invalidReason="calibration missing")
  fill(msg.init(service))
  expected = msg.to_dict()
  with log.Event.from_bytes(msg.to_bytes()) as decoded:
    assert decoded.which() == service
    assert decoded.to_dict() == expected
    assert decoded.logMonoTime == 123456789 and not decoded.valid
    assert decoded.invalidReason == "calibration missing"


def test_event_defaults_to_valid_with_no_reason():
  msg = log.Event.new_message()
  assert msg.valid is True and msg.invalidReason == "" and msg.logMonoTime == 0


@pytest.mark.parametrize("struct, fields", [
  (log.StageTimings, ["uploadMs", "warpMs", "modelMs", "readbackMs", "parseMs"]),
  (log.ModelDataV2, ["frameId", "frameIdExtra", "frameAge", "frameDropPerc", "timestampSof", "timestampEof",
                     "modelExecutionTime", "rawPredictions", "position", "orientation", "velocity",
                     "orientationRate", "acceleration", "laneLines", "laneLineProbs", "laneLineStds", "roadEdges",
                     "roadEdgeStds", "leadsV3", "meta", "confidence", "action", "stageTimings", "modelName",
                     "fallbackReason"]),
  (log.DrivingModelData, ["frameId", "frameIdExtra", "frameDropPerc", "modelExecutionTime", "action",
                          "laneLineMeta", "meta", "path", "timestampSof", "timestampEof", "stageTimings",
                          "modelName", "fallbackReason"]),
  (log.CameraOdometry, ["trans", "rot", "transStd", "rotStd", "frameId", "timestampSof", "timestampEof",
                        "wideFromDeviceEuler", "wideFromDeviceEulerStd", "roadTransformTrans",
                        "roadTransformTransStd", "stageTimings"]),
  (log.DriverStateV2, ["frameId", "modelExecutionTime", "gpuExecutionTime", "rawPredictions", "wheelOnRightProb",
                       "leftDriverData", "rightDriverData", "timestampSof", "timestampEof", "stageTimings",
                       "framesDropped"]),
  (log.DriverStateV2.DriverData, ["faceOrientation", "faceOrientationStd", "facePosition", "facePositionStd",
                                  "faceProb", "leftEyeProb", "rightEyeProb", "leftBlinkProb", "rightBlinkProb",
                                  "sunglassesProb", "phoneProb", "sleepProb"]),
  (log.FrameData, ["frameId", "timestampSof", "timestampEof", "sensor"]),
  (log.ExtrinsicsCalibration, ["rpyCalib", "calStatus", "calPerc", "validBlocks", "calCycle", "rpyCalibSpread",
                               "wideFromDeviceEuler", "height", "extrinsicMatrix"]),
  (log.LateralDelay, ["lateralDelay"]),
  (log.CarState, ["vEgo", "steeringAngleDeg", "steeringPressed", "gasPressed", "brakePressed", "leftBlinker",
                  "rightBlinker", "standstill", "cruiseState", "gearShifter"]),
  (log.CarControl, ["enabled", "latActive", "longActive", "actuators"]),
  (log.DeviceState, ["deviceType", "started"]),
  (log.SelfdriveState, ["enabled", "active", "state", "engageable", "alertText1", "alertText2", "alertStatus",
                        "alertSize", "events"]),
  (log.ManagerState.ProcessState, ["name", "pid", "running", "shouldBeRunning", "exitCode", "restarts"]),
  (log.EngageRequest, ["engage"]),
])
def test_fields_other_packages_rely_on(struct, fields):
  missing = [f for f in fields if f not in struct.schema.fields]
  assert not missing, f"{struct.schema.node.displayName} lacks {missing}"


def test_enums_carry_the_reference_names():
  assert list(log.SelfdriveState.OpenpilotState.schema.enumerants) == [
    "disabled", "preEnabled", "enabled", "softDisabling", "overriding"]
  assert list(log.ModelDataV2.ConfidenceClass.schema.enumerants) == ["red", "yellow", "green"]
  assert list(log.ExtrinsicsCalibration.Status.schema.enumerants) == [
    "uncalibrated", "calibrated", "invalid", "recalibrating"]
  assert {"tici", "pc"} <= set(log.DeviceType.schema.enumerants)
  assert {"unknown", "ar0231", "ox03c10", "os04c10"} == set(log.FrameData.ImageSensor.schema.enumerants)


def test_driving_model_data_shares_the_model_action():
  msg = log.Event.new_message()
  dmd = msg.init("drivingModelData")
  dmd.action.desiredCurvature = 0.25
  dmd.path.xCoefficients = [1., 2., 3., 4., 5.]
  assert dmd.action.schema.node.id == log.ModelDataV2.Action.schema.node.id
  with log.Event.from_bytes(msg.to_bytes()) as r:
    assert r.drivingModelData.action.desiredCurvature == 0.25
    assert list(r.drivingModelData.path.xCoefficients) == [1., 2., 3., 4., 5.]
