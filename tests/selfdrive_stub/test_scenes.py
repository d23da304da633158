"""Synthetic scenes: deterministic per seed, moving over time, and a cabin driver that follows the script."""
import numpy as np

from selfdrive_stub.producers.scenes import CABIN_SCRIPT_PERIOD_S, FPS, SceneRenderer, cabin_script, render_frame
from visionipc.nv12 import padded_nv12_layout


def luma(frame: bytes, width=1344, height=760) -> np.ndarray:
  _, stride, _ = padded_nv12_layout(width, height)
  return np.frombuffer(frame, np.uint8)[: height * stride].reshape(height, stride)[:, :width]


def test_frame_n_of_a_seed_is_always_the_same_and_seeds_differ():
  a, b = SceneRenderer("mici", seed=1), SceneRenderer("mici", seed=2)
  for stream in ("road", "wide", "cabin"):
    assert a.frame(stream, 40) == render_frame("mici", stream, 1, 40)
    assert a.frame(stream, 40) != b.frame(stream, 40)
    assert a.frame(stream, 40) != a.frame(stream, 41), f"{stream} scene does not move"
  frame = a.frame("road", 0)
  size, stride, uv_offset = padded_nv12_layout(1344, 760)
  assert len(frame) == size
  assert set(frame[uv_offset: uv_offset + stride * 380]) <= {0, 128}  # neutral chroma, zero padding


def test_cabin_script_phases():
  assert cabin_script(1.0)["phase"] == "attentive" and not cabin_script(1.0)["looking_away"]
  assert cabin_script(2.05)["blinking"] and cabin_script(2.05)["eyes_closed"]
  assert cabin_script(13.0)["looking_away"] and abs(cabin_script(13.0)["yaw"]) > 0.6
  assert cabin_script(24.0)["eyes_closed"] and not cabin_script(24.0)["blinking"]
  for t in (1.0, 13.0, 24.0):
    again = cabin_script(t + CABIN_SCRIPT_PERIOD_S)
    assert again["phase"] == cabin_script(t)["phase"] and abs(again["yaw"] - cabin_script(t)["yaw"]) < 1e-9
  away = [t / FPS for t in range(int(CABIN_SCRIPT_PERIOD_S * FPS)) if cabin_script(t / FPS)["looking_away"]]
  assert 5.0 < len(away) / FPS < 6.5


def test_the_face_changes_where_the_script_says():
  renderer = SceneRenderer("mici", seed=0)
  attentive, other_attentive = luma(renderer.frame("cabin", 20)), luma(renderer.frame("cabin", 21))
  away, closed = luma(renderer.frame("cabin", 13 * FPS)), luma(renderer.frame("cabin", 24 * FPS))
  changed = lambda x, y: np.mean(np.abs(x.astype(int) - y.astype(int)) > 40)
  assert changed(attentive, other_attentive) < 0.002  # sway only
  assert changed(attentive, away) > 0.01             # the head turned
  assert changed(attentive, closed) > 0.001          # the eyes shut
  dark_eye_pixels = lambda img: int(np.sum(img < 25))  # irises are the darkest thing in the scene
  assert dark_eye_pixels(attentive) > 2 * dark_eye_pixels(closed)
