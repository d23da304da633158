"""Model-side constants (facts from openpilot's selfdrive/modeld/constants.py)."""
import numpy as np

MODEL_RUN_FREQ = 20
MODEL_CONTEXT_FREQ = 5
FRAME_SKIP = MODEL_RUN_FREQ // MODEL_CONTEXT_FREQ  # 4: the image pair is (t-4, t)
DT_MDL = 1.0 / MODEL_RUN_FREQ
N_FRAMES = 2
FEATURE_LEN = 512
HISTORY_LEN = 24         # past hidden states fed back, at 5 Hz
DESIRE_LEN = 8
DESIRE_HISTORY = 25      # desire pulses, max-pooled to 5 Hz
TRAFFIC_CONVENTION_LEN = 2

IDX_N = 33


def index_function(idx, max_val: float, max_idx: int = 32) -> np.ndarray:
  return max_val * (np.asarray(idx, dtype=np.float64) / max_idx) ** 2


T_IDXS = index_function(np.arange(IDX_N), 10.0)
X_IDXS = index_function(np.arange(IDX_N), 192.0)
LEAD_T_IDXS = [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
LEAD_T_OFFSETS = [0.0, 2.0, 4.0]
META_T_IDXS = [2.0, 4.0, 6.0, 8.0, 10.0]

NUM_LANE_LINES = 4
NUM_ROAD_EDGES = 2
LANE_LINES_WIDTH = 2
LEAD_TRAJ_LEN = 6
LEAD_WIDTH = 4
NUM_LEADS = 3
PLAN_WIDTH = 15
POSE_WIDTH = 6
WIDE_FROM_DEVICE_WIDTH = 3
DESIRE_PRED_LEN = 4

FCW_THRESHOLDS_5MS2 = np.array([.05, .05, .15, .15, .15], dtype=np.float32)
FCW_THRESHOLDS_3MS2 = np.array([.7, .7], dtype=np.float32)
CONFIDENCE_BUFFER_LEN = 5
RYG_GREEN = 0.01165
RYG_YELLOW = 0.06157
POLY_PATH_DEGREE = 4

LAT_SMOOTH_SECONDS = 0.0
LONG_SMOOTH_SECONDS = 0.3
MIN_LAT_CONTROL_SPEED = 0.3
MIN_STABLE_DELAY = 0.3     # below this action delay the plan is interpolated linearly from t=0
MIN_CURVATURE_SPEED = 1.0


class Plan:
  POSITION = slice(0, 3)
  VELOCITY = slice(3, 6)
  ACCELERATION = slice(6, 9)
  T_FROM_CURRENT_EULER = slice(9, 12)
  ORIENTATION_RATE = slice(12, 15)


class Meta:
  """Columns of the 55-wide sigmoid `meta` head (engaged, then 5 horizons x 6 disengage heads, then 6 x 4 presses)."""
  ENGAGED = slice(0, 1)
  GAS_DISENGAGE = slice(1, 31, 6)
  BRAKE_DISENGAGE = slice(2, 31, 6)
  STEER_OVERRIDE = slice(3, 31, 6)
  HARD_BRAKE_3 = slice(4, 31, 6)
  HARD_BRAKE_4 = slice(5, 31, 6)
  HARD_BRAKE_5 = slice(6, 31, 6)
  GAS_PRESS = slice(31, 55, 4)
  BRAKE_PRESS = slice(32, 55, 4)
  LEFT_BLINKER = slice(33, 55, 4)
  RIGHT_BLINKER = slice(34, 55, 4)


# output heads (name -> width) of our models, in output order (the base model's output slices)
OUTPUT_HEADS = (
  ("meta", 55), ("desire_pred", 32), ("pose", 12), ("wide_from_device_euler", 6), ("road_transform", 12),
  ("lane_lines", 528), ("lane_lines_prob", 8), ("road_edges", 264), ("lead", 144), ("lead_prob", 3),
  ("hidden_state", 512), ("plan", 990), ("desire_state", 8), ("pad", 2),
)
OUTPUT_SIZE = sum(w for _, w in OUTPUT_HEADS)  # 2576
REQUIRED_HEADS = tuple(name for name, _ in OUTPUT_HEADS if name != "pad")
