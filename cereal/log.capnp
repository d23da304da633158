@0xeec0d2a4b06d306d;

# pymodeld message schema. One `Event` per bus message; the active union member is the service name.
#
# Field names follow openpilot's cereal (newest service names); ordinals are our own, compact ones.
# Rules for editing:
#   - Never renumber, retype or remove a field: append new fields (and new union members) with the next
#     free ordinal. Old logs must keep decoding.
#   - A struct added for a new service gets a union member in Event AND an entry in services.py.

# ---------------------------------------------------------------------------------------------------
# Shared enums and small structs

struct StageTimings {
  # Per-stage wall time of one model frame, in milliseconds.
  uploadMs @0 :Float32;
  warpMs @1 :Float32;
  modelMs @2 :Float32;
  readbackMs @3 :Float32;
  parseMs @4 :Float32;
}

enum LaneChangeState {
  off @0;
  preLaneChange @1;
  laneChangeStarting @2;
  laneChangeFinishing @3;
}

enum LaneChangeDirection {
  none @0;
  left @1;
  right @2;
}

enum Desire {
  none @0;
  turnLeft @1;
  turnRight @2;
  laneChangeLeft @3;
  laneChangeRight @4;
  keepLeft @5;
  keepRight @6;
  reserved7 @7;
}

enum ModelSource {
  # which road model produced a modelV2 (openpilot 2026 publishes its model source)
  small @0;   # the CPU model
  big @1;     # the model on the USB GPU
}

enum DeviceType {
  unknown @0;
  neo @1;
  chffrAndroid @2;
  chffrIos @3;
  tici @4;
  pc @5;
  tizi @6;
  mici @7;
}

# ---------------------------------------------------------------------------------------------------
# Camera frames (narrowRoadCameraState, wideRoadCameraState, cabinCameraState)

struct FrameData {
  frameId @0 :UInt32;
  timestampSof @1 :UInt64;   # start of frame, monotonic ns
  timestampEof @2 :UInt64;   # end of frame, monotonic ns
  sensor @3 :ImageSensor;
  integLines @4 :Int32;
  gain @5 :Float32;
  exposureValPercent @6 :Float32;
  measuredGreyFraction @7 :Float32;
  targetGreyFraction @8 :Float32;
  processingTime @9 :Float32;
  transform @10 :List(Float32);
  requestId @11 :UInt32;
  encodeId @12 :UInt32;

  enum ImageSensor {
    unknown @0;
    ar0231 @1;
    ox03c10 @2;
    os04c10 @3;
  }
}

# ---------------------------------------------------------------------------------------------------
# Road model outputs (modelV2, drivingModelData, cameraOdometry)

struct ModelDataV2 {
  frameId @0 :UInt32;
  frameIdExtra @1 :UInt32;
  frameAge @2 :UInt32;
  frameDropPerc @3 :Float32;
  timestampEof @4 :UInt64;
  modelExecutionTime @5 :Float32;   # seconds
  rawPredictions @6 :Data;          # raw float32 model output when SEND_RAW_PRED is on

  position @7 :XYZTData;
  orientation @8 :XYZTData;
  velocity @9 :XYZTData;
  orientationRate @10 :XYZTData;
  acceleration @11 :XYZTData;

  laneLines @12 :List(XYZTData);
  laneLineProbs @13 :List(Float32);
  laneLineStds @14 :List(Float32);
  roadEdges @15 :List(XYZTData);
  roadEdgeStds @16 :List(Float32);

  leadsV3 @17 :List(LeadDataV3);
  meta @18 :MetaData;
  confidence @19 :ConfidenceClass;
  temporalPose @20 :Pose;
  action @21 :Action;

  # pymodeld additions
  timestampSof @22 :UInt64;
  stageTimings @23 :StageTimings;
  modelName @24 :Text;        # which road model ran: "big" or "small"
  fallbackReason @25 :Text;   # why the daemon switched to the small model; empty if it did not
  modelSource @26 :ModelSource;   # the model that produced this message (== modelName as an enum)
  malformedInputs @27 :UInt32;    # carState / calibration messages rejected as malformed since start

  struct XYZTData {
    x @0 :List(Float32);
    y @1 :List(Float32);
    z @2 :List(Float32);
    t @3 :List(Float32);
    xStd @4 :List(Float32);
    yStd @5 :List(Float32);
    zStd @6 :List(Float32);
  }

  struct LeadDataV3 {
    prob @0 :Float32;
    probTime @1 :Float32;
    t @2 :List(Float32);
    x @3 :List(Float32);
    xStd @4 :List(Float32);
    y @5 :List(Float32);
    yStd @6 :List(Float32);
    v @7 :List(Float32);
    vStd @8 :List(Float32);
    a @9 :List(Float32);
    aStd @10 :List(Float32);
  }

  struct MetaData {
    engagedProb @0 :Float32;
    desirePrediction @1 :List(Float32);
    desireState @2 :List(Float32);
    disengagePredictions @3 :DisengagePredictions;
    hardBrakePredicted @4 :Bool;
    laneChangeState @5 :LaneChangeState;
    laneChangeDirection @6 :LaneChangeDirection;
  }

  struct DisengagePredictions {
    t @0 :List(Float32);
    brakeDisengageProbs @1 :List(Float32);
    gasDisengageProbs @2 :List(Float32);
    steerOverrideProbs @3 :List(Float32);
    brake3MetersPerSecondSquaredProbs @4 :List(Float32);
    brake4MetersPerSecondSquaredProbs @5 :List(Float32);
    brake5MetersPerSecondSquaredProbs @6 :List(Float32);
    gasPressProbs @7 :List(Float32);
    brakePressProbs @8 :List(Float32);
  }

  enum ConfidenceClass {
    red @0;
    yellow @1;
    green @2;
  }

  struct Pose {
    trans @0 :List(Float32);
    rot @1 :List(Float32);
    transStd @2 :List(Float32);
    rotStd @3 :List(Float32);
  }

  struct Action {
    desiredCurvature @0 :Float32;
    desiredAcceleration @1 :Float32;
    shouldStop @2 :Bool;
  }
}

struct DrivingModelData {
  frameId @0 :UInt32;
  frameIdExtra @1 :UInt32;
  frameDropPerc @2 :Float32;
  modelExecutionTime @3 :Float32;
  action @4 :ModelDataV2.Action;
  laneLineMeta @5 :LaneLineMeta;
  meta @6 :MetaData;
  path @7 :PolyPath;

  # pymodeld additions
  timestampSof @8 :UInt64;
  timestampEof @9 :UInt64;
  stageTimings @10 :StageTimings;
  modelName @11 :Text;
  fallbackReason @12 :Text;
  modelSource @13 :ModelSource;

  struct LaneLineMeta {
    leftY @0 :Float32;
    rightY @1 :Float32;
    leftProb @2 :Float32;
    rightProb @3 :Float32;
  }

  struct MetaData {
    laneChangeState @0 :LaneChangeState;
    laneChangeDirection @1 :LaneChangeDirection;
  }

  struct PolyPath {
    # degree-4 polynomial fits of modelV2.position over T_IDXS, lowest order first
    xCoefficients @0 :List(Float32);
    yCoefficients @1 :List(Float32);
    zCoefficients @2 :List(Float32);
  }
}

struct CameraOdometry {
  trans @0 :List(Float32);   # m/s in device frame
  rot @1 :List(Float32);     # rad/s in device frame
  transStd @2 :List(Float32);
  rotStd @3 :List(Float32);
  frameId @4 :UInt32;
  timestampEof @5 :UInt64;
  wideFromDeviceEuler @6 :List(Float32);
  wideFromDeviceEulerStd @7 :List(Float32);
  roadTransformTrans @8 :List(Float32);
  roadTransformTransStd @9 :List(Float32);

  # pymodeld additions
  timestampSof @10 :UInt64;
  stageTimings @11 :StageTimings;
}

# ---------------------------------------------------------------------------------------------------
# Driver monitoring (driverStateV2, driverMonitoringState)

struct DriverStateV2 {
  frameId @0 :UInt32;
  modelExecutionTime @1 :Float32;
  gpuExecutionTime @2 :Float32;
  rawPredictions @3 :Data;
  wheelOnRightProb @4 :Float32;
  leftDriverData @5 :DriverData;
  rightDriverData @6 :DriverData;

  # pymodeld additions
  timestampSof @7 :UInt64;
  timestampEof @8 :UInt64;
  stageTimings @9 :StageTimings;
  framesDropped @10 :UInt32;

  struct DriverData {
    faceOrientation @0 :List(Float32);
    faceOrientationStd @1 :List(Float32);
    facePosition @2 :List(Float32);
    facePositionStd @3 :List(Float32);
    faceProb @4 :Float32;
    leftEyeProb @5 :Float32;
    rightEyeProb @6 :Float32;
    leftBlinkProb @7 :Float32;
    rightBlinkProb @8 :Float32;
    sunglassesProb @9 :Float32;
    phoneProb @10 :Float32;
    sleepProb @11 :Float32;
  }
}

struct DriverMonitoringState {
  lockout @0 :Bool;
  lockoutCount @1 :Int8;
  lockoutMinutesRemaining @2 :Int8;
  alert3Count @3 :Int8;
  noResponseCount @4 :Int8;
  noResponseForceDecel @5 :Bool;
  alwaysOn @6 :Bool;
  alwaysOnLockout @7 :Bool;
  alertLevel @8 :AlertLevel;
  activePolicy @9 :MonitoringPolicy;
  isRHD @10 :Bool;
  rhdCalibration @11 :CalibrationState;
  visionPolicyState @12 :VisionPolicyState;
  wheeltouchPolicyState @13 :WheeltouchPolicyState;

  # pymodeld addition: names of the monitoring events active this step (e.g. "driverDistracted1")
  events @14 :List(Text);
  # openpilot's current policy: how close the terminal-alert lockout is (3 terminal alerts / 30 s of them)
  alertCountLockoutPercent @15 :Int8;
  alertTimeLockoutPercent @16 :Int8;
  # pymodeld addition: model outputs and car messages rejected as malformed (short lists, NaN) since start
  malformedInputs @17 :UInt32;

  enum AlertLevel {
    none @0;
    one @1;
    two @2;
    three @3;
  }

  enum MonitoringPolicy {
    wheeltouch @0;
    vision @1;
  }

  struct CalibrationState {
    calibratedPercent @0 :Int8;
    offset @1 :Float32;
  }

  struct VisionPolicyState {
    awarenessPercent @0 :Int8;
    awarenessStep @1 :Float32;
    isDistracted @2 :Bool;
    distractedTypes @3 :DistractedTypes;
    faceDetected @4 :Bool;
    pose @5 :PoseState;
    wheeltouchFallbackPercent @6 :Int8;
    uncertainOffroadAlertPercent @7 :Int8;

    struct DistractedTypes {
      pose @0 :Bool;
      eye @1 :Bool;
      phone @2 :Bool;
      sleep @3 :Bool;
    }

    struct PoseState {
      pitch @0 :Float32;
      yaw @1 :Float32;
      pitchCalib @2 :CalibrationState;
      yawCalib @3 :CalibrationState;
      calibrated @4 :Bool;
      uncertainty @5 :Float32;
    }
  }

  struct WheeltouchPolicyState {
    awarenessPercent @0 :Int8;
    awarenessStep @1 :Float32;
    driverInteracting @2 :Bool;
  }
}

# ---------------------------------------------------------------------------------------------------
# Calibration and delay estimates (extrinsicsCalibration, lateralDelay)

struct ExtrinsicsCalibration {
  calStatus @0 :Status;
  calCycle @1 :Int32;
  calPerc @2 :Int8;
  validBlocks @3 :Int32;
  extrinsicMatrix @4 :List(Float32);
  rpyCalib @5 :List(Float32);         # device_from_calib euler (roll, pitch, yaw), rad
  rpyCalibSpread @6 :List(Float32);
  wideFromDeviceEuler @7 :List(Float32);
  height @8 :List(Float32);

  enum Status {
    uncalibrated @0;
    calibrated @1;
    invalid @2;
    recalibrating @3;
  }
}

struct LateralDelay {
  lateralDelay @0 :Float32;   # seconds, the value consumers use
  validBlocks @1 :Int32;
  status @2 :Status;
  lateralDelayEstimate @3 :Float32;
  lateralDelayEstimateStd @4 :Float32;
  calPerc @5 :Int8;

  enum Status {
    unestimated @0;
    estimated @1;
    invalid @2;
  }
}

# ---------------------------------------------------------------------------------------------------
# Car stub (carState, carControl, deviceState, engageRequest)

struct CarState {
  vEgo @0 :Float32;
  aEgo @1 :Float32;
  vEgoRaw @2 :Float32;
  yawRate @3 :Float32;
  standstill @4 :Bool;
  steeringAngleDeg @5 :Float32;
  steeringRateDeg @6 :Float32;
  steeringTorque @7 :Float32;
  steeringPressed @8 :Bool;
  gasPressed @9 :Bool;
  brakePressed @10 :Bool;
  leftBlinker @11 :Bool;
  rightBlinker @12 :Bool;
  gearShifter @13 :GearShifter;
  cruiseState @14 :CruiseState;
  doorOpen @15 :Bool;
  seatbeltUnlatched @16 :Bool;
  canValid @17 :Bool;
  leftBlindspot @18 :Bool;
  rightBlindspot @19 :Bool;

  struct CruiseState {
    enabled @0 :Bool;
    available @1 :Bool;
    speed @2 :Float32;
    speedCluster @3 :Float32;
    standstill @4 :Bool;
    nonAdaptive @5 :Bool;
  }

  enum GearShifter {
    unknown @0;
    park @1;
    drive @2;
    neutral @3;
    reverse @4;
    sport @5;
    low @6;
    brake @7;
    eco @8;
    manumatic @9;
  }
}

struct CarControl {
  enabled @0 :Bool;
  latActive @1 :Bool;
  longActive @2 :Bool;
  actuators @3 :Actuators;
  leftBlinker @4 :Bool;
  rightBlinker @5 :Bool;

  struct Actuators {
    accel @0 :Float32;              # m/s^2
    torque @1 :Float32;             # normalized [-1, 1]
    steeringAngleDeg @2 :Float32;
    curvature @3 :Float32;          # 1/m
    speed @4 :Float32;              # m/s
    longControlState @5 :LongControlState;

    enum LongControlState {
      off @0;
      pid @1;
      stopping @2;
      starting @3;
    }
  }
}

struct DeviceState {
  started @0 :Bool;
  startedMonoTime @1 :UInt64;
  deviceType @2 :DeviceType;
  chestnutPresent @3 :Bool;       # the external USB GPU is attached
  freeSpacePercent @4 :Float32;
  memoryUsagePercent @5 :Int8;
  cpuUsagePercent @6 :List(Int8);
  cpuTempC @7 :List(Float32);
  gpuTempC @8 :List(Float32);
  maxTempC @9 :Float32;
  thermalStatus @10 :ThermalStatus;

  enum ThermalStatus {
    green @0;
    yellow @1;
    red @2;
    danger @3;
  }
}

struct EngageRequest {
  engage @0 :Bool;   # true: the driver asks to engage; false: to disengage
}

struct UsbGpuState {
  # modeld's view of the USB GPU and the big model on it (openpilot 2026: ChestnutLoading/Active, chestnutState)
  plugged @0 :Bool;       # the USB+AMD device opened
  state @1 :State;
  reason @2 :Text;        # why the big model is not used or failed; empty while loading or ready
  modelSource @3 :ModelSource;   # the model that drives now

  enum State {
    absent @0;    # no device or no big model file: small model only
    loading @1;   # the big model is loading; the small one runs meanwhile
    ready @2;     # the big model drives
    failed @3;    # the big model failed to load or failed while running; the small one drives
  }
}

# ---------------------------------------------------------------------------------------------------
# Safety gate and launcher (selfdriveState, managerState)

struct SelfdriveState {
  enabled @0 :Bool;
  active @1 :Bool;
  state @2 :OpenpilotState;
  engageable @3 :Bool;
  alertText1 @4 :Text;
  alertText2 @5 :Text;
  alertStatus @6 :AlertStatus;
  alertSize @7 :AlertSize;
  alertType @8 :Text;
  events @9 :List(Text);   # names of the active events, e.g. "modeldLagging"
  experimentalMode @10 :Bool;
  malformedInputs @11 :UInt32;   # pymodeld addition: input messages rejected as malformed since start

  enum OpenpilotState {
    disabled @0;
    preEnabled @1;
    enabled @2;
    softDisabling @3;
    overriding @4;
  }

  enum AlertStatus {
    normal @0;
    userPrompt @1;
    critical @2;
  }

  enum AlertSize {
    none @0;
    small @1;
    mid @2;
    full @3;
  }
}

struct ManagerState {
  processes @0 :List(ProcessState);

  struct ProcessState {
    name @0 :Text;
    pid @1 :Int32;
    running @2 :Bool;
    shouldBeRunning @3 :Bool;
    exitCode @4 :Int32;
    restarts @5 :UInt32;
  }
}

# ---------------------------------------------------------------------------------------------------
# The envelope

struct Event {
  logMonoTime @0 :UInt64;      # monotonic ns when the message was built
  valid @1 :Bool = true;
  invalidReason @2 :Text;      # why valid is false; empty when valid

  union {
    narrowRoadCameraState @3 :FrameData;
    wideRoadCameraState @4 :FrameData;
    cabinCameraState @5 :FrameData;
    extrinsicsCalibration @6 :ExtrinsicsCalibration;
    lateralDelay @7 :LateralDelay;
    modelV2 @8 :ModelDataV2;
    drivingModelData @9 :DrivingModelData;
    cameraOdometry @10 :CameraOdometry;
    driverStateV2 @11 :DriverStateV2;
    driverMonitoringState @12 :DriverMonitoringState;
    carState @13 :CarState;
    carControl @14 :CarControl;
    deviceState @15 :DeviceState;
    engageRequest @16 :EngageRequest;
    selfdriveState @17 :SelfdriveState;
    managerState @18 :ManagerState;
    usbGpuState @19 :UsbGpuState;
  }
}
