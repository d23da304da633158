"""Every supported op against onnxruntime on random shapes and attribute values (tiny one-node models), on both
backends: the compiled one (CPU: generated C) and the reference one (REF: the numpy kernels)."""
import numpy as np
import pytest
from onnx import numpy_helper

from runtime import OnnxRunner
from runtime.kernels import supported_ops

from rt_helpers import ort_run, tiny_model

R = np.random.default_rng(1234)


def f32(*shape, lo=-2.0, hi=2.0):
  return R.uniform(lo, hi, shape).astype(np.float32)


def i64(*vals):
  return np.array(vals, np.int64)


def case(op, inputs, consts=None, attrs=None, opset=17, n_out=1, id=None, rtol=1e-4, atol=1e-5):
  return pytest.param(op, inputs, consts or {}, attrs or {}, opset, n_out, rtol, atol, id=id or op)


UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Floor", "Ceil", "Sign", "Softplus", "Softsign",
         "Erf", "Sin", "Cos", "Round"]
CASES = [case(op, {"x": f32(2, 3, 4)}) for op in UNARY]
CASES += [
    case("Sqrt", {"x": f32(3, 5, lo=0.1)}), case("Log", {"x": f32(3, 5, lo=0.1)}),
    case("Reciprocal", {"x": f32(3, 5, lo=0.5)}), case("Tan", {"x": f32(3, 5, lo=-1, hi=1)}),
    case("LeakyRelu", {"x": f32(2, 7)}, attrs={"alpha": 0.13}),
    case("Elu", {"x": f32(2, 7)}, attrs={"alpha": 0.7}),
    case("Selu", {"x": f32(2, 7)}, attrs={"alpha": 1.5, "gamma": 1.1}),
    case("Celu", {"x": f32(2, 7)}, attrs={"alpha": 0.8}),
    case("HardSigmoid", {"x": f32(2, 7, lo=-5, hi=5)}, attrs={"alpha": 0.3, "beta": 0.4}),
    case("Gelu", {"x": f32(4, 6)}, opset=20, id="Gelu-erf"),
    case("Gelu", {"x": f32(4, 6)}, attrs={"approximate": "tanh"}, opset=20, id="Gelu-tanh"),
    case("Not", {"x": R.random((3, 4)) > 0.5}),
    case("Identity", {"x": f32(3, 4)}),
    case("Dropout", {"x": f32(3, 4)}),
    case("Dropout", {"x": f32(3, 4)}, n_out=2, id="Dropout-mask"),
    case("PRelu", {"x": f32(2, 3, 4, 4)}, {"s": f32(3, 1, 1)}),
    case("Clip", {"x": f32(3, 8)}, {"lo": np.float32(-0.5), "hi": np.float32(0.7)}),
    case("Clip", {"x": f32(3, 8)}, attrs={"min": -0.3, "max": 0.2}, opset=6, id="Clip-attrs"),
    case("Clip", {"x": f32(3, 8), "lo": np.array(-0.25, np.float32)}, id="Clip-dynamic-min"),
    case("Cast", {"x": R.integers(0, 255, (2, 3, 4)).astype(np.uint8)}, attrs={"to": 1}, id="Cast-u8-f32"),
    case("Cast", {"x": f32(3, 4, lo=-9, hi=9)}, attrs={"to": 7}, id="Cast-f32-i64"),
    case("Cast", {"x": f32(3, 4)}, attrs={"to": 10}, id="Cast-f32-f16"),
    case("BitCast", {"x": f32(3, 4)}, attrs={"to": 6}, opset=26, id="BitCast-f32-i32"),
    case("Where", {"c": R.random((3, 1)) > 0.5, "a": f32(3, 4), "b": f32(1, 4)}),
    case("Min", {"a": f32(3, 4), "b": f32(4), "c": f32(1, 4)}), case("Max", {"a": f32(3, 4), "b": f32(3, 1)}),
    case("Sum", {"a": f32(2, 3), "b": f32(3), "c": f32(2, 3)}), case("Mean", {"a": f32(2, 3), "b": f32(2, 3)}),
    case("Sum", {"a": f32(2, 3)}, id="Sum-one"),
    case("Pow", {"a": f32(3, 4, lo=0.1), "b": f32(4)}),
    case("Pow", {"a": f32(3, 4)}, {"b": np.array(2.0, np.float32)}, id="Pow-square"),
    case("Mod", {"a": R.integers(-20, 20, (3, 4)).astype(np.int64), "b": R.integers(1, 7, (4,)).astype(np.int64)}),
    case("Mod", {"a": f32(3, 4), "b": f32(3, 4, lo=0.5)}, attrs={"fmod": 1}, id="Mod-fmod"),
    case("Div", {"a": R.integers(-20, 20, (5,)).astype(np.int64), "b": R.integers(1, 7, (5,)).astype(np.int64)},
         id="Div-int"),
    case("BitShift", {"a": np.array([1, 2, 200], np.uint8), "b": np.array([1, 2, 3], np.uint8)},
         attrs={"direction": "RIGHT"}),
    case("CastLike", {"x": f32(3), "t": np.zeros(1, np.float64)}),
]
for op in ["Add", "Sub", "Mul", "Div"]:
  CASES += [case(op, {"a": f32(2, 3, 4), "b": f32(3, 1)}, id=f"{op}-bcast"),
            case(op, {"a": f32(4, 1), "b": f32(2, 4, 5, lo=0.5)}, id=f"{op}-bcast-left"),
            case(op, {"a": f32(2, 5)}, {"b": np.array(1.5, np.float32)}, id=f"{op}-scalar-const")]
for op in ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]:
  CASES.append(case(op, {"a": R.integers(0, 3, (3, 4)).astype(np.int64),
                         "b": R.integers(0, 3, (4,)).astype(np.int64)}))
for op in ["And", "Or", "Xor"]:
  CASES.append(case(op, {"a": R.random((3, 4)) > 0.5, "b": R.random((1, 4)) > 0.5}))

# ---- conv family
CASES += [
    case("Conv", {"x": f32(1, 3, 9, 9)}, {"w": f32(4, 3, 3, 3), "b": f32(4)}, {"pads": [1, 1, 1, 1]}, id="Conv-pad"),
    case("Conv", {"x": f32(2, 4, 11, 10)}, {"w": f32(6, 4, 3, 2)}, {"strides": [2, 3], "pads": [1, 0, 2, 1]},
         id="Conv-strided-asym"),
    case("Conv", {"x": f32(1, 6, 8, 8)}, {"w": f32(6, 2, 3, 3), "b": f32(6)}, {"group": 3, "dilations": [2, 1]},
         id="Conv-grouped-dilated"),
    case("Conv", {"x": f32(2, 5, 10, 10)}, {"w": f32(5, 1, 3, 3)}, {"group": 5, "strides": [2, 2],
                                                                    "pads": [1, 1, 1, 1]}, id="Conv-depthwise"),
    case("Conv", {"x": f32(1, 4, 7, 7)}, {"w": f32(8, 1, 3, 3)}, {"group": 4, "auto_pad": "SAME_UPPER"},
         id="Conv-depthwise-multiplier-same"),
    case("Conv", {"x": f32(2, 12, 6, 6)}, {"w": f32(12, 1, 3, 3), "b": f32(12)}, {"group": 12, "pads": [1, 1, 1, 1]},
         id="Conv-depthwise-channels-last-bias"),
    case("Conv", {"x": f32(1, 3, 10, 10)}, {"w": f32(3, 1, 3, 3), "b": f32(3)}, {"group": 3, "pads": [0, 1, 1, 0]},
         id="Conv-depthwise-channels-first-bias"),
    case("Conv", {"x": f32(2, 4, 12, 14)}, {"w": f32(4, 1, 3, 3), "b": f32(4)},
         {"group": 4, "pads": [1, 2, 0, 1], "dilations": [1, 2]}, id="Conv-depthwise-gemv-dilated-bias"),
    case("Conv", {"x": f32(1, 3, 16, 16)}, {"w": f32(3, 1, 5, 3)}, {"group": 3}, id="Conv-depthwise-gemv-unpadded"),
    case("Conv", {"x": f32(1, 3, 44, 40)}, {"w": f32(3, 1, 3, 3), "b": f32(3)},
         {"group": 3, "strides": [2, 2], "pads": [1, 1, 1, 1]}, id="Conv-depthwise-strided-grouped-im2col"),
    case("Conv", {"x": f32(1, 4, 7, 6)}, {"w": f32(3, 4, 1, 1), "b": f32(3)}, id="Conv-1x1"),
    case("Conv", {"x": f32(2, 18, 7, 8)}, {"w": f32(3, 18, 3, 2), "b": f32(3)},
         {"pads": [1, 0, 2, 1], "dilations": [2, 1]}, id="Conv-few-outputs-shifted"),
    case("Conv", {"x": f32(1, 16, 5, 5)}, {"w": f32(2, 16, 3, 3)}, id="Conv-few-outputs-unpadded"),
    # 144-term sums reaching |25|: float32 rounding in any summation order is ~1e-5 absolute, so an output that
    # cancels to near zero needs an atol above that (the reference kernels miss 1e-5 there as much as ours)
    case("Conv", {"x": f32(1, 16, 52, 50)}, {"w": f32(16, 16, 3, 3), "b": f32(16)}, {"pads": [1, 1, 1, 1]},
         id="Conv-large-image-shifted", atol=1e-4),
    case("Conv", {"x": f32(1, 3, 8, 9)}, {"w": f32(2, 3, 4, 4)}, {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
         id="Conv-same-lower"),
    case("Conv", {"x": f32(1, 3, 8, 9)}, {"w": f32(2, 3, 3, 3)}, {"auto_pad": "VALID"}, id="Conv-valid"),
    case("Conv", {"x": f32(2, 3, 12)}, {"w": f32(4, 3, 3)}, {"pads": [2, 1], "strides": [2]}, id="Conv-1d"),
    case("Conv", {"x": f32(1, 2, 5, 6, 5)}, {"w": f32(3, 2, 2, 3, 2)}, {"pads": [1, 0, 1, 0, 1, 0]}, id="Conv-3d"),
    case("ConvTranspose", {"x": f32(1, 3, 5, 5)}, {"w": f32(3, 2, 3, 3), "b": f32(2)}, {"strides": [2, 2]},
         id="ConvTranspose-stride"),
    case("ConvTranspose", {"x": f32(2, 4, 4, 3)}, {"w": f32(4, 1, 2, 3)},
         {"group": 2, "pads": [1, 0, 0, 1], "output_padding": [1, 0], "strides": [2, 1]}, id="ConvTranspose-group"),
    case("ConvTranspose", {"x": f32(1, 2, 4, 4)}, {"w": f32(2, 3, 3, 3)},
         {"strides": [2, 2], "output_shape": [8, 8]}, id="ConvTranspose-output-shape"),
    case("ConvTranspose", {"x": f32(1, 2, 4, 4)}, {"w": f32(2, 3, 3, 3)}, {"dilations": [2, 2]},
         id="ConvTranspose-dilated"),
    case("Gemm", {"a": f32(3, 5)}, {"b": f32(4, 5), "c": f32(4)}, {"transB": 1, "alpha": 0.5, "beta": 2.0}),
    case("Gemm", {"a": f32(5, 3), "b": f32(5, 4)}, {"c": f32(3, 1)}, {"transA": 1}, id="Gemm-dynamic-B"),
    case("Gemm", {"a": f32(2, 3), "b": f32(3, 4), "c": f32(2, 4)}, {}, {"beta": 0.5}, id="Gemm-dynamic-C"),
    case("MatMul", {"a": f32(2, 3, 4, 5), "b": f32(3, 5, 2)}, id="MatMul-batched"),
    case("MatMul", {"a": f32(4)}, {"b": f32(4, 3)}, id="MatMul-vec"),
    case("MatMul", {"a": f32(2, 4, 6)}, {"b": f32(6)}, id="MatMul-mat-vec"),
]
# ---- pooling and normalisation
CASES += [
    case("MaxPool", {"x": f32(1, 3, 9, 9)}, attrs={"kernel_shape": [3, 3], "strides": [2, 2]}),
    case("MaxPool", {"x": f32(2, 2, 10, 7)}, attrs={"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1],
                                                   "ceil_mode": 1}, id="MaxPool-ceil-pad"),
    case("MaxPool", {"x": f32(1, 2, 9, 9)}, attrs={"kernel_shape": [2, 2], "dilations": [2, 2]}, id="MaxPool-dil"),
    case("MaxPool", {"x": f32(1, 2, 7, 7)}, attrs={"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER",
                                                  "strides": [2, 2]}, id="MaxPool-same"),
    case("MaxPool", {"x": f32(2, 3, 11)}, attrs={"kernel_shape": [3], "strides": [2], "pads": [1, 1]},
         id="MaxPool-1d"),
    case("MaxPool", {"x": f32(1, 2, 5, 9)}, attrs={"kernel_shape": [1, 3], "strides": [1, 2], "pads": [0, 1, 0, 1]},
         id="MaxPool-one-row-kernel"),
    case("AveragePool", {"x": f32(1, 2, 6, 6)}, attrs={"kernel_shape": [2, 2], "strides": [1, 1]},
         id="AveragePool-two-taps"),
    case("MaxPool", {"x": f32(1, 2, 6, 7)}, attrs={"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]},
         id="MaxPool-no-tap-sees-every-output"),
    case("AveragePool", {"x": f32(1, 2, 9, 8)}, attrs={"kernel_shape": [3, 2], "strides": [2, 1],
                                                      "pads": [2, 1, 2, 0], "count_include_pad": 1},
         id="AveragePool-wide-pads-include"),
    case("AveragePool", {"x": f32(1, 3, 9, 9)}, attrs={"kernel_shape": [3, 3], "strides": [2, 2],
                                                      "pads": [1, 1, 1, 1]}, id="AveragePool-exclude-pad"),
    case("AveragePool", {"x": f32(1, 3, 9, 9)}, attrs={"kernel_shape": [3, 3], "strides": [2, 2],
                                                      "pads": [1, 1, 1, 1], "count_include_pad": 1},
         id="AveragePool-include-pad"),
    case("AveragePool", {"x": f32(1, 2, 8, 7)}, attrs={"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
         id="AveragePool-ceil"),
    case("GlobalAveragePool", {"x": f32(2, 3, 5, 6)}), case("GlobalMaxPool", {"x": f32(2, 3, 5, 6)}),
    case("BatchNormalization", {"x": f32(2, 3, 4, 5)},
         {"s": f32(3), "b": f32(3), "m": f32(3), "v": f32(3, lo=0.5)}, {"epsilon": 1e-3}),
    case("InstanceNormalization", {"x": f32(2, 3, 4, 5)}, {"s": f32(3), "b": f32(3)}),
    case("LayerNormalization", {"x": f32(2, 3, 6)}, {"s": f32(6), "b": f32(6)}),
    case("LayerNormalization", {"x": f32(2, 3, 6)}, {"s": f32(3, 6)}, {"axis": 1}, n_out=3, id="LayerNorm-axis-stats"),
    case("LRN", {"x": f32(1, 7, 4, 4)}, attrs={"size": 3, "alpha": 1e-2, "beta": 0.75, "bias": 2.0}),
    case("Softmax", {"x": f32(2, 3, 5)}), case("Softmax", {"x": f32(2, 3, 5)}, attrs={"axis": 1}, id="Softmax-axis1"),
    case("Softmax", {"x": f32(2, 3, 5)}, attrs={"axis": 1}, opset=11, id="Softmax-legacy"),
    case("LogSoftmax", {"x": f32(2, 3, 5)}), case("Hardmax", {"x": f32(2, 5)}),
]
# ---- reductions
for op in ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1",
           "ReduceL2", "ReduceLogSumExp"]:
  CASES.append(case(op, {"x": f32(2, 3, 4)}, {"axes": i64(0, -1)}, {"keepdims": 0}, opset=18, id=f"{op}-axes"))
CASES += [
    case("ReduceLogSum", {"x": f32(2, 3, 4, lo=0.1)}, attrs={"keepdims": 1}, opset=18),
    case("ReduceSum", {"x": f32(2, 3, 4)}, {"axes": i64(1)}, opset=13, id="ReduceSum-13"),
    case("ReduceMean", {"x": f32(2, 3, 4)}, attrs={"axes": [1]}, opset=13, id="ReduceMean-13-attr"),
    case("ReduceMax", {"x": f32(2, 3, 4)}, attrs={"noop_with_empty_axes": 1}, opset=18, id="ReduceMax-noop"),
    case("ArgMax", {"x": f32(3, 4, 5)}, attrs={"axis": 1, "keepdims": 0}),
    case("ArgMax", {"x": np.array([[1, 3, 3], [2, 2, 0]], np.float32)}, attrs={"axis": 1, "select_last_index": 1},
         id="ArgMax-last"),
    case("ArgMin", {"x": f32(3, 4)}, attrs={"axis": -1}),
    case("TopK", {"x": R.integers(0, 4, (3, 9)).astype(np.float32)}, {"k": i64(4)}, n_out=2, id="TopK-ties"),
    case("TopK", {"x": f32(4, 5, 3)}, {"k": i64(5)}, {"axis": 1, "largest": 0}, n_out=2, id="TopK-smallest-all"),
    case("TopK", {"x": R.integers(-9, 9, (2, 6)).astype(np.int64)}, {"k": i64(2)}, {"axis": 0}, n_out=2, id="TopK-int"),
    case("TopK", {"x": f32(3, 8)}, attrs={"k": 3}, opset=9, n_out=2, id="TopK-9-attr"),
]
# ---- shape / data movement
CASES += [
    case("Reshape", {"x": f32(2, 3, 4)}, {"s": i64(0, -1, 2)}),
    case("Flatten", {"x": f32(2, 3, 4, 5)}, attrs={"axis": 2}), case("Flatten", {"x": f32(2, 3)}, attrs={"axis": 0},
                                                                     id="Flatten-0"),
    case("Squeeze", {"x": f32(2, 1, 3, 1)}, {"a": i64(1, -1)}), case("Squeeze", {"x": f32(1, 3, 1)}, id="Squeeze-all"),
    case("Unsqueeze", {"x": f32(2, 3)}, {"a": i64(0, -1)}),
    case("Unsqueeze", {"x": f32(2, 3)}, attrs={"axes": [1]}, opset=11, id="Unsqueeze-11"),
    case("Transpose", {"x": f32(2, 3, 4)}, attrs={"perm": [1, 2, 0]}), case("Transpose", {"x": f32(2, 3)},
                                                                           id="Transpose-default"),
    case("Concat", {"a": f32(2, 3), "b": f32(2, 1), "c": f32(2, 4)}, attrs={"axis": -1}),
    case("Split", {"x": f32(2, 7)}, {"s": i64(3, 4)}, {"axis": 1}, n_out=2),
    case("Split", {"x": f32(6, 2)}, n_out=3, id="Split-even"),
    case("Split", {"x": f32(7, 2)}, attrs={"num_outputs": 3}, opset=18, n_out=3, id="Split-num-outputs"),
    case("Slice", {"x": f32(5, 6, 7)}, {"st": i64(1, -5), "en": i64(4, 100), "ax": i64(0, 2), "sp": i64(2, 1)}),
    case("Slice", {"x": f32(5, 6)}, {"st": i64(-1), "en": i64(-100), "ax": i64(1), "sp": i64(-2)},
         id="Slice-negative-step"),
    case("Slice", {"x": f32(5, 6)}, attrs={"starts": [1], "ends": [3], "axes": [1]}, opset=9, id="Slice-attrs"),
    case("Gather", {"x": f32(5, 4)}, {"i": np.array([[0, -1], [2, 3]], np.int64)}, {"axis": 0}),
    case("Gather", {"x": f32(3, 5), "i": np.array([4, 0, 1], np.int64)}, attrs={"axis": 1}, id="Gather-dynamic"),
    case("Expand", {"x": f32(3, 1)}, {"s": i64(2, 1, 4)}),
    case("Tile", {"x": f32(2, 3)}, {"r": i64(2, 3)}),
    case("Pad", {"x": f32(2, 3, 4)}, {"p": i64(0, 1, 2, 0, 2, 1), "v": np.array(0.5, np.float32)}),
    case("Pad", {"x": f32(3, 4)}, {"p": i64(1, 2, 1, 2)}, {"mode": "reflect"}, id="Pad-reflect"),
    case("Pad", {"x": f32(3, 4)}, {"p": i64(2, 0, 1, 3)}, {"mode": "edge"}, id="Pad-edge"),
    case("Pad", {"x": f32(3, 4)}, {"p": i64(-1, 1, 0, -2)}, id="Pad-negative"),
    case("Shape", {"x": f32(2, 3, 4)}), case("Shape", {"x": f32(2, 3, 4)}, attrs={"start": 1}, id="Shape-start"),
    case("Size", {"x": f32(2, 3, 4)}),
    case("ConstantOfShape", {}, {"s": i64(2, 3)}, {"value": numpy_helper.from_array(np.array([1.5], np.float32))}),
]
# ---- resize
CASES += [
    case("Resize", {"x": f32(1, 2, 3, 4)}, {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2, 2], np.float32)},
         {"mode": "nearest"}, id="Resize-nearest-2x"),
    case("Resize", {"x": f32(1, 2, 4, 5)},
         {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 1.5, 0.6], np.float32)},
         {"mode": "linear"}, id="Resize-linear-half-pixel"),
    case("Resize", {"x": f32(1, 2, 4, 5)}, {"roi": np.zeros(0, np.float32), "sc": np.zeros(0, np.float32),
                                            "sz": i64(1, 2, 7, 3)},
         {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, id="Resize-linear-align-sizes"),
    case("Resize", {"x": f32(1, 1, 3, 3)},
         {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2.5, 1.5], np.float32)},
         {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
         id="Resize-nearest-asym-floor"),
    case("Resize", {"x": f32(1, 1, 4, 4)}, {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2, 2], np.float32)},
         {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, id="Resize-linear-pytorch"),
    case("Upsample", {"x": f32(1, 2, 3, 3)}, {"sc": np.array([1, 1, 2, 3], np.float32)}, {"mode": "nearest"}, opset=9),
]


# ops the reference kernels gained with the onnx-case work; appended, so the random values of
# the cases above do not change
_IDX = R.integers(0, 3, (2, 3)).astype(np.int64)
# in [-0.45, -0.05], so that the second call's 2x + 1 stays inside arccos / arcsin / arctanh's domain
CASES += [case(op, {"x": f32(2, 5, lo=-0.45, hi=-0.05)}) for op in ["Acos", "Asin", "Atan", "Asinh", "Atanh", "Cosh", "Sinh"]]
CASES += [
    case("Acosh", {"x": f32(2, 5, lo=1.1, hi=4)}),
    case("ThresholdedRelu", {"x": f32(3, 5)}, attrs={"alpha": 0.5}),
    case("Shrink", {"x": f32(3, 5)}, attrs={"lambd": 0.4, "bias": 0.1}),
    case("HardSwish", {"x": f32(3, 5, lo=-5, hi=5)}, opset=14),
    case("Mish", {"x": f32(3, 5)}, opset=18),
    case("BitwiseAnd", {"a": R.integers(-99, 99, (3, 4)).astype(np.int32), "b": R.integers(-99, 99, (4,)).astype(np.int32)},
         opset=18),
    case("BitwiseOr", {"a": R.integers(0, 255, (3, 4)).astype(np.uint8), "b": R.integers(0, 255, (3, 4)).astype(np.uint8)},
         opset=18),
    case("BitwiseXor", {"a": R.integers(-99, 99, (5,)).astype(np.int64), "b": R.integers(-99, 99, (5,)).astype(np.int64)},
         opset=18),
    case("BitwiseNot", {"x": R.integers(-99, 99, (2, 5)).astype(np.int32)}, opset=18),
    case("IsNaN", {"x": np.array([1.0, np.nan, -np.inf, 0.0], np.float32)}, opset=13),
    case("IsInf", {"x": np.array([1.0, np.nan, -np.inf, np.inf], np.float32)}, attrs={"detect_positive": 0}, opset=10),
    case("GatherElements", {"x": f32(3, 4), "i": _IDX}, attrs={"axis": 1}, opset=13),
    case("GatherND", {"x": f32(3, 4, 2), "i": np.array([[0, 1], [2, 3]], np.int64)}, opset=13),
    case("ScatterElements", {"x": f32(3, 4), "i": _IDX, "u": f32(2, 3)}, attrs={"axis": 1, "reduction": "add"},
         opset=18),
    case("Scatter", {"x": f32(3, 4), "i": np.array([[0, 1, 2]], np.int64), "u": f32(1, 3)}, attrs={"axis": 1},
         opset=10),
    case("ScatterND", {"x": f32(4, 3), "i": np.array([[1], [3]], np.int64), "u": f32(2, 3)},
         attrs={"reduction": "mul"}, opset=18),
    case("Trilu", {"x": f32(2, 4, 5)}, {"k": np.array(1, np.int64)}, attrs={"upper": 0}, opset=14),
    case("EyeLike", {"x": f32(3, 5)}, attrs={"k": -1}),
    case("CumSum", {"x": f32(3, 4)}, {"axis": np.array(1, np.int64)}, attrs={"exclusive": 1, "reverse": 1}),
    case("CumProd", {"x": f32(3, 4, lo=0.5)}, {"axis": np.array(0, np.int64)}, attrs={"exclusive": 1}, opset=26),
    case("Swish", {"x": f32(3, 5)}, attrs={"alpha": 0.7}, opset=24),
    case("RMSNormalization", {"x": f32(2, 3, 4)}, {"s": f32(3, 4)}, attrs={"axis": 1, "epsilon": 1e-3}, opset=23),
    case("DepthToSpace", {"x": f32(1, 8, 2, 3)}, attrs={"blocksize": 2, "mode": "CRD"}, opset=13),
    case("SpaceToDepth", {"x": f32(1, 2, 4, 6)}, attrs={"blocksize": 2}, opset=13),
    case("LpNormalization", {"x": f32(3, 5)}, attrs={"axis": 0, "p": 1}),
    case("MeanVarianceNormalization", {"x": f32(2, 3, 4, 5)}, opset=13),
    case("GroupNormalization", {"x": f32(2, 4, 3, 3)}, {"s": f32(4), "b": f32(4)}, attrs={"num_groups": 2}, opset=21),
    case("GroupNormalization", {"x": f32(2, 6, 17)}, {"s": f32(3), "b": f32(3)}, attrs={"num_groups": 3, "epsilon": 1e-3},
         opset=18, id="GroupNormalization-18-per-group"),
    case("GroupNormalization", {"x": f32(1, 32, 9, 11)}, {"s": f32(32), "b": f32(32)}, attrs={"num_groups": 8}, opset=21,
         id="GroupNormalization-wide"),
    case("Det", {"x": f32(2, 3, 3)}, opset=11),
    case("Range", {}, {"a": np.array(1.5, np.float32), "b": np.array(9.0, np.float32), "c": np.array(1.25, np.float32)},
         opset=11),
    case("LpPool", {"x": f32(1, 2, 7, 6)}, attrs={"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]},
         opset=18),
    case("GlobalLpPool", {"x": f32(2, 3, 4, 4)}, attrs={"p": 3}),
    case("NegativeLogLikelihoodLoss", {"x": f32(3, 4, 2), "t": np.array([[0, 3], [1, 1], [2, 0]], np.int64)},
         {"w": f32(4, lo=0.5)}, attrs={"reduction": "mean", "ignore_index": 1}, opset=13),
    case("SoftmaxCrossEntropyLoss", {"x": f32(3, 5), "t": np.array([4, 0, 2], np.int64)}, attrs={"reduction": "none"},
         opset=13, n_out=2),
]


def _other_values(a):
  """Different values of the same spec (integers only permuted: they may be indices)."""
  if a.dtype == np.bool_:
    return ~a
  b = a[::-1].copy() if a.ndim else a.copy()
  return np.asarray(b if a.dtype.kind in "iu" else b * 2 + 1, dtype=a.dtype)


BACKENDS = ["CPU", "REF"]


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("op,inputs,consts,attrs,opset,n_out,rtol,atol", CASES)
def test_op_matches_onnxruntime(op, inputs, consts, attrs, opset, n_out, rtol, atol, device):
  model = tiny_model(op, inputs, attrs, n_outputs=n_out, consts=consts, opset=opset)
  runner = OnnxRunner(model, device=device)
  runner(**{n: _other_values(a) for n, a in inputs.items()})  # a kernel must not freeze its first call
  ours = runner(**inputs)
  ref = ort_run(model, inputs)
  for i, r in enumerate(ref):
    got = ours[f"y{i}"]
    assert got.dtype == r.dtype, f"output {i}: dtype {got.dtype} vs onnxruntime {r.dtype}"
    assert got.shape == r.shape, f"output {i}: shape {got.shape} vs onnxruntime {r.shape}"
    if got.dtype.kind == "f":
      np.testing.assert_allclose(got, r, rtol=rtol, atol=atol)
    else:
      np.testing.assert_array_equal(got, r)


def test_every_registered_op_has_a_parity_case():
  covered = {p.values[0] for p in CASES} | {"Constant"}  # Constant: covered in test_core_passes
  missing = sorted(set(supported_ops()) - covered)
  assert not missing, f"ops without a parity test: {missing}"


def _random_window_attrs(rng, nd, with_dil=True):
  k = [int(rng.integers(1, 4)) for _ in range(nd)]
  attrs = {"kernel_shape": k, "strides": [int(rng.integers(1, 3)) for _ in range(nd)]}
  if with_dil:
    attrs["dilations"] = [int(rng.integers(1, 3)) for _ in range(nd)]
  if rng.random() < 0.3:
    attrs["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    if attrs["auto_pad"] != "VALID":  # onnxruntime rejects SAME with dilation or stride > kernel
      attrs.pop("dilations", None)
      attrs["strides"] = [min(s, kk) for s, kk in zip(attrs["strides"], k)]
  else:
    attrs["pads"] = [int(rng.integers(0, kk)) for kk in k] * 2 if rng.random() < 0.5 else \
        [int(rng.integers(0, kk)) for kk in k + k]
  return attrs


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("seed", range(12))
def test_random_conv_configurations(seed, device):
  rng = np.random.default_rng(100 + seed)
  nd = int(rng.choice([1, 2, 2, 3]))
  G = int(rng.choice([1, 1, 2, 3]))
  Cg, Mg = int(rng.integers(1, 4)), int(rng.integers(1, 4))
  attrs = _random_window_attrs(rng, nd)
  attrs["group"] = G
  k = attrs.pop("kernel_shape")
  x = rng.standard_normal((int(rng.integers(1, 3)), G * Cg) + tuple(int(rng.integers(5, 10)) for _ in range(nd)))
  consts = {"w": rng.standard_normal((G * Mg, Cg) + tuple(k)).astype(np.float32)}
  if rng.random() < 0.5:
    consts["b"] = rng.standard_normal(G * Mg).astype(np.float32)
  inputs = {"x": x.astype(np.float32)}
  model = tiny_model("Conv", inputs, attrs, consts=consts)
  runner = OnnxRunner(model, device=device)
  runner(x=inputs["x"] * 2 + 1)
  np.testing.assert_allclose(runner(**inputs)["y0"], ort_run(model, inputs)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("seed", range(12))
def test_random_pool_configurations(seed, device):
  rng = np.random.default_rng(200 + seed)
  nd = int(rng.choice([1, 2, 2, 3]))
  op = str(rng.choice(["MaxPool", "AveragePool"]))
  attrs = _random_window_attrs(rng, nd, with_dil=op == "MaxPool")
  if "auto_pad" not in attrs and rng.random() < 0.5:
    attrs["ceil_mode"] = 1
  if op == "AveragePool":
    attrs["count_include_pad"] = int(rng.integers(0, 2))
  x = rng.standard_normal((1, 3) + tuple(int(rng.integers(6, 10)) for _ in range(nd))).astype(np.float32)
  model = tiny_model(op, {"x": x}, attrs)
  runner = OnnxRunner(model, device=device)
  runner(x=x * 2 + 1)
  np.testing.assert_allclose(runner(x=x)["y0"], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("op,k", [("AveragePool", [1, 8]), ("AveragePool", [2, 2]), ("MaxPool", [1, 4]),
                                  ("MaxPool", [3, 2]), ("AveragePool", [8, 1])])
def test_non_overlapping_pools(op, k, device):
  x = f32(2, 3, 24, 16)
  model = tiny_model(op, {"x": x}, {"kernel_shape": k, "strides": k})
  np.testing.assert_allclose(OnnxRunner(model, device=device)(x=x)["y0"], ort_run(model, {"x": x})[0], rtol=1e-5,
                             atol=1e-6)
