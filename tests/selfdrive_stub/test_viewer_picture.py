"""The viewer's picture labels itself: a title with the namespace and the time, the note that the shipped
models are random-weight stand-ins, a legend, and the wide road camera beside the narrow one. Text is drawn at
a legible size after scaling (it used to be Pillow's 10 px default, shrunk again with the picture)."""
import time

import numpy as np
import pytest
from PIL import Image, ImageDraw

from common.cameras import TICI
from selfdrive_stub.supervisor import viewer
from selfdrive_stub.supervisor.viewer import (LANE_COLOR, LEGEND, NOTE_BACKGROUND, PATH_COLOR, STAND_IN_NOTE, Scene, render_view,
                                   title_line)

T = time.mktime((2026, 12, 2, 19, 30, 5, 0, 0, 0)) - time.timezone   # 2026-12-02 19:30:05 UTC


def _straight(y, z, xs=np.linspace(2, 60, 40)):
  return np.stack([xs, np.full_like(xs, y), np.full_like(xs, z)], 1)


class TextRecorder:
  """Records every string render_view draws, with its font size, by wrapping ImageDraw.text."""

  def __init__(self, monkeypatch):
    self.texts: list[tuple[str, int]] = []
    real = ImageDraw.ImageDraw.text
    recorder = self

    def text(draw, xy, text, *args, **kw):
      f = kw.get("font")
      recorder.texts.append((text, getattr(f, "size", 0)))
      return real(draw, xy, text, *args, **kw)
    monkeypatch.setattr(ImageDraw.ImageDraw, "text", text)

  def joined(self) -> str:
    return " ".join(t for t, _ in self.texts)


def test_the_title_names_the_namespace_and_the_utc_time():
  assert title_line(Scene(namespace="demo", time_s=T)) == "pymodeld viewer   namespace demo   2026-12-02 19:30:05 UTC"
  assert "default namespace" in title_line(Scene(namespace=None, time_s=T))


def test_the_picture_draws_the_title_the_stand_in_note_the_legend_and_the_status_lines(monkeypatch):
  rec = TextRecorder(monkeypatch)
  render_view(Scene(namespace="demo", time_s=T, lines=["road model: small  frame 7  valid True"]))
  text = rec.joined()
  assert "namespace demo" in text and "2026-12-02 19:30:05 UTC" in text
  assert " ".join(STAND_IN_NOTE.split()) in " ".join(text.split())   # wrapped onto lines, every word drawn
  assert "random weights" in STAND_IN_NOTE and "not the warp" in STAND_IN_NOTE
  assert "legend" in text and all(" ".join(label.split()) in " ".join(text.split()) for _, label in LEGEND)
  assert "road model: small  frame 7  valid True" in text
  assert "no wide road camera frames" in text and "no narrow road camera frames" in text


def test_text_is_drawn_with_a_legible_font_at_the_output_size(monkeypatch):
  rec = TextRecorder(monkeypatch)
  img = render_view(Scene(namespace="demo", time_s=T))
  assert img.width == 1600
  sizes = [s for _, s in rec.texts]
  if viewer.font(20).__class__.__name__ == "FreeTypeFont":
    assert min(sizes) >= 18   # 20 px body text at 1600 px wide, never Pillow's 10 px default
  assert all(t for t, _ in rec.texts)


def test_the_stand_in_note_is_a_visible_band_under_the_title():
  img = np.asarray(render_view(Scene(namespace="demo", time_s=T)))
  band = (img == NOTE_BACKGROUND).all(axis=2)
  rows = np.flatnonzero(band[:, -5])      # the band runs to the right edge
  assert len(rows) > 30 and rows[0] < 80  # two or more lines of text tall, right below the title


def test_the_wide_camera_is_shown_beside_the_narrow_one_with_the_predictions():
  narrow = np.full((1208, 1928), 60, np.uint8)
  wide = np.full((1208, 1928), 140, np.uint8)
  scene = Scene(road_y=narrow, road_intrinsics=TICI.road.intrinsics, wide_y=wide, wide_intrinsics=TICI.wide.intrinsics,
                path=_straight(0.0, 0.0), lanes=[(_straight(-1.8, 1.22), 0.9)], namespace="demo", time_s=T)
  img = np.asarray(render_view(scene))
  h = img.shape[0]
  # the narrow camera is the top-left panel, the wide one the top-right: their own grey shows through
  left, right = img[h // 2 - 40, 40], img[h // 2 - 40, 1600 - 40]
  assert tuple(left) == (60, 60, 60) and tuple(right) == (140, 140, 140)
  # both show the predicted path and lane lines (projected through each camera's own intrinsics)
  for x0 in (0, 800):
    panel = img[:, x0:x0 + 800]
    assert (panel == PATH_COLOR).all(axis=2).sum() > 50
    assert (panel == LANE_COLOR).all(axis=2).sum() > 50


def test_without_the_wide_camera_its_panel_says_so(monkeypatch):
  rec = TextRecorder(monkeypatch)
  render_view(Scene(road_y=np.full((1208, 1928), 60, np.uint8), road_intrinsics=TICI.road.intrinsics, time_s=T))
  text = rec.joined()
  assert "narrow road camera" in text and "no wide road camera frames" in text


def test_the_face_yaw_tick_points_to_the_side_the_head_turned():
  cabin = np.full((960, 1440), 90, np.uint8)
  def tick_side(yaw):
    img = np.asarray(viewer.render_cabin(Scene(cabin=cabin, face_position=(0.0, 0.0), face_prob=0.9, face_yaw=yaw)))
    row = (img[356 + 40] == viewer.FACE_COLOR).all(axis=1)
    return np.flatnonzero(row).mean() - 720
  assert tick_side(0.7) > 40 and tick_side(-0.7) < -40


@pytest.mark.parametrize("width", [800, 1600, 2400])
def test_the_picture_fits_the_width_it_is_asked_for(width):
  img = render_view(Scene(time_s=T), width=width)
  assert img.width == width and img.mode == "RGB"
  assert isinstance(img, Image.Image)
