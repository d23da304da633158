"""runtime/README.md's Python API snippet runs as written and prints what its `→` comments say, so the doc
cannot drift from the API. The model it loads is built here with the onnx package, with random (not constant)
weights, so a runner that folded or ignored them would not reproduce numpy's answer."""
import contextlib
import io
import pathlib
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

README = pathlib.Path(__file__).resolve().parents[2] / "runtime" / "README.md"


def readme_snippet() -> str:
  section = README.read_text().split("## Python API", 1)[1].split("\n## ", 1)[0]
  blocks = re.findall(r"```python\n(.*?)```", section, re.S)
  assert len(blocks) == 1, "the Python API section has exactly one python snippet"
  return blocks[0]


def expected_prints(code: str) -> list[str]:
  return [line.split("# → ", 1)[1].strip() for line in code.splitlines() if "# → " in line]


def write_model(path: pathlib.Path, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
  """y = Relu(x @ w + b), x float32 (1, 8), y float32 (1, 4), w and b random initialisers."""
  rng = np.random.default_rng(seed)
  w, b = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
  assert np.unique(w).size == w.size   # non-constant weights
  graph = helper.make_graph(
    [helper.make_node("Gemm", ["x", "w", "b"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "readme",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
  model.ir_version = 8
  onnx.checker.check_model(model)
  onnx.save(model, str(path))
  return w, b


def run_snippet(code: str) -> tuple[dict, list[str]]:
  out = io.StringIO()
  scope: dict = {"__name__": "readme_snippet"}
  with contextlib.redirect_stdout(out):
    exec(compile(code, str(README), "exec"), scope)   # noqa: S102  (the repo's own doc, the point of the test)
  return scope, out.getvalue().splitlines()


def test_the_readme_python_snippet_runs_and_prints_what_it_says(tmp_path, monkeypatch):
  w, b = write_model(tmp_path / "model.onnx")
  monkeypatch.chdir(tmp_path)
  code = readme_snippet()
  scope, printed = run_snippet(code)
  expected = expected_prints(code)
  assert len(expected) >= 4
  assert [line for line in printed if line in expected] == expected, printed
  # the run's answer is the model's, weights included
  np.testing.assert_allclose(scope["y"], np.maximum(scope["x"] @ w + b, 0), rtol=1e-5, atol=1e-6)


def test_the_snippets_load_error_branch_catches_a_file_that_is_not_a_model(tmp_path, monkeypatch):
  (tmp_path / "model.onnx").write_bytes(b"\x0bnot a model\xff" * 8)
  monkeypatch.chdir(tmp_path)
  with pytest.raises(SystemExit, match="cannot load the model: cannot parse ONNX model"):
    run_snippet(readme_snippet())


def test_every_error_class_the_readme_names_exists_where_it_says():
  import builtins

  from runtime import device, errors
  text = README.read_text().split("## Python API", 1)[1].split("\n## ", 1)[0]
  table = [row for row in text.splitlines() if row.startswith("| `")]
  names = {n for row in table for n in re.findall(r"`([A-Z]\w+)`", row.split("|")[1])}
  assert names, "the errors table lists classes"
  for name in names:
    cls = getattr(errors, name, None) or getattr(device, name, None) or getattr(builtins, name, None)
    assert isinstance(cls, type) and issubclass(cls, Exception), name
