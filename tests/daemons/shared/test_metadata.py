"""Model metadata and the I/O contract: every malformed slice is a ModelMetadataError naming its head, and a
model that does not fit its daemon is told so in one error that lists every mismatch, inputs first."""
import base64
import json
import pickle

import onnx
import pytest

from daemons.common.metadata import ModelMetadataError, load_metadata, load_pickled_slices, runner_metadata, validate_slices
from daemons.dmonitoringmodeld.model_state import DM_CONTRACT, MODEL_PATH
from daemons.modeld.model_state import MODEL_PATHS, ROAD_CONTRACT
from repo_paths import REPO_ROOT
from runtime import OnnxRunner


def _blob(slices) -> str:
  return base64.b64encode(pickle.dumps(slices)).decode()


@pytest.mark.parametrize("bad, error", [
  (slice("a", "b"), r"head 'face': slice start 'a' is a str, not an integer"),
  (slice(0, 2.5), r"head 'face': slice stop 2.5 is a float, not an integer"),
  (slice(0, 4, 0), r"head 'face': slice step 0 is not supported"),
  (slice(0, 4, 2), r"head 'face': slice step 2 is not supported"),
  (slice(True, 4), r"head 'face': slice start True is a bool"),
])
def test_pickled_slices_of_the_wrong_kind_name_the_head(bad, error):
  with pytest.raises(ModelMetadataError, match=error):
    load_pickled_slices(_blob({"ok": slice(0, 1), "face": bad}))
  with pytest.raises(ModelMetadataError, match=error):   # built by hand, they are refused by the validator too
    validate_slices({"face": bad}, 10)


@pytest.mark.parametrize("entry", [[1.5, 3], ["0", "3"], [0], [0, 1, 2], True, [False, 3]])
def test_json_slices_that_are_not_two_integers_name_the_head(tmp_path, entry):
  model = onnx.load(MODEL_PATH)
  del model.metadata_props[:]
  model.metadata_props.add(key="output_slices_json", value=json.dumps({"face_prob_lhd": entry}))
  path = str(tmp_path / "m.onnx")
  onnx.save(model, path)
  with pytest.raises(ModelMetadataError, match="head 'face_prob_lhd'"):
    load_metadata(path)


def _dm_model_with(tmp_path, dtype=None, shape=None, rename=None, drop_head=None, no_metadata=False):
  model = onnx.load(MODEL_PATH)
  img = next(i for i in model.graph.input if i.name == "input_img")
  if dtype is not None:
    img.type.tensor_type.elem_type = dtype
  if shape is not None:
    for d, v in zip(img.type.tensor_type.shape.dim, shape):
      d.dim_value = v
  if rename is not None:
    calib = next(i for i in model.graph.input if i.name == "calib")
    calib.name = rename
  if drop_head is not None:
    props = {p.key: p.value for p in model.metadata_props}
    slices = json.loads(props["output_slices_json"])
    del slices[drop_head]
    del model.metadata_props[:]
    for k, v in {**props, "output_slices_json": json.dumps(slices)}.items():
      model.metadata_props.add(key=k, value=v)
  if no_metadata:
    del model.metadata_props[:]
  path = str(tmp_path / "dm.onnx")
  onnx.save(model, path)
  return path


def test_every_contract_mismatch_is_listed_in_one_error_inputs_first(tmp_path):
  path = _dm_model_with(tmp_path, dtype=onnx.TensorProto.FLOAT, shape=(1, 1000), rename="calibration",
                        drop_head="sleep_prob_rhd")
  with pytest.raises(ModelMetadataError) as e:
    load_metadata(path, contract=DM_CONTRACT)
  text = str(e.value)
  expected = ["missing inputs ['calib']", "unexpected inputs ['calibration']", "input 'input_img' is float32, expected uint8",
              "input 'input_img' has shape (1, 1000), expected (1, 1382400)", "lacks required output heads ['sleep_prob_rhd']"]
  positions = [text.find(part) for part in expected]
  assert all(p >= 0 for p in positions), text
  assert positions == sorted(positions), text          # inputs come first, then the heads
  assert text.startswith(f"{path} does not fit dmonitoringmodeld (the driver monitoring model contract): "), text
  assert text.count("; ") == 4 and "\n" not in text, text   # five problems, one line


def test_a_model_with_wrong_inputs_and_no_metadata_is_told_all_of_it_in_one_error_inputs_first(tmp_path):
  path = _dm_model_with(tmp_path, shape=(1, 1000), rename="calibration", no_metadata=True)
  with pytest.raises(ModelMetadataError) as e:
    load_metadata(path, contract=DM_CONTRACT)
  assert str(e.value) == (f"{path} does not fit dmonitoringmodeld (the driver monitoring model contract): "
                          "missing inputs ['calib']; unexpected inputs ['calibration']; "
                          "input 'input_img' has shape (1, 1000), expected (1, 1382400); no output_slices in metadata_props")


def test_unreadable_slices_do_not_hide_the_input_mismatches(tmp_path):
  path = _dm_model_with(tmp_path, dtype=onnx.TensorProto.FLOAT)
  model = onnx.load(path)
  next(p for p in model.metadata_props if p.key == "output_slices_json").value = "{not json"
  onnx.save(model, path)
  with pytest.raises(ModelMetadataError) as e:
    load_metadata(path, contract=DM_CONTRACT)
  text = str(e.value)
  assert "input 'input_img' is float32, expected uint8; output_slices_json is not JSON" in text, text


def test_the_road_model_given_to_the_dm_daemon_is_told_every_mismatch(tmp_path):
  with pytest.raises(ModelMetadataError) as e:
    load_metadata(MODEL_PATHS["small"], contract=DM_CONTRACT)
  text = str(e.value)
  assert "missing inputs ['input_img', 'calib']" in text and "unexpected inputs ['img'" in text
  assert "lacks required output heads" in text


def test_shipped_models_meet_their_contracts():
  for path in MODEL_PATHS.values():
    load_metadata(path, contract=ROAD_CONTRACT)
  load_metadata(MODEL_PATH, contract=DM_CONTRACT)


def _readme_tables(path):
  """{'input': {name: (dtype, shape)}, 'head': {name: width}} from a daemon README's contract tables."""
  inputs, heads = {}, {}
  for row in open(path).read().split("## Model contract", 1)[1].split("\n## ", 1)[0].splitlines():
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    if len(cells) == 3 and cells[0].startswith("`"):
      inputs[cells[0].strip("`")] = (cells[1], tuple(int(x) for x in cells[2].strip("()").split(",")))
    elif len(cells) == 2 and cells[0].startswith("`"):
      for name in cells[0].split(","):
        heads[name.strip().strip("`")] = int(cells[1])
  return inputs, heads


@pytest.mark.parametrize("readme, contract", [("daemons/dmonitoringmodeld/README.md", DM_CONTRACT),
                                              ("daemons/modeld/README.md", ROAD_CONTRACT)])
def test_the_daemon_readmes_state_the_contract_the_code_checks(readme, contract):
  inputs, heads = _readme_tables(f"{REPO_ROOT}/{readme}")
  assert inputs == contract.inputs
  assert heads == contract.heads


@pytest.mark.parametrize("path,contract", [(MODEL_PATH, DM_CONTRACT), (MODEL_PATHS["small"], ROAD_CONTRACT)])
def test_a_compiled_model_gives_the_same_metadata_as_its_file(path, contract):
  """runner_metadata reads what load_metadata reads, from the compiled program (no onnx needed)."""
  from_file = load_metadata(path, contract=contract)
  from_runner = runner_metadata(OnnxRunner(path), path, contract=contract)
  assert from_runner.output_slices == from_file.output_slices
  assert (from_runner.input_shapes, from_runner.input_dtypes) == (from_file.input_shapes, from_file.input_dtypes)
  assert from_runner.output_shapes == from_file.output_shapes and from_runner.props == from_file.props


def test_a_compiled_model_that_misses_the_contract_names_every_mismatch():
  with pytest.raises(ModelMetadataError, match=r"does not fit modeld \(the road model contract\): missing inputs"):
    runner_metadata(OnnxRunner(MODEL_PATH), MODEL_PATH, contract=ROAD_CONTRACT)
