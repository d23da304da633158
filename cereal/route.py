"""Routes: one recorded drive on disk — the message log, the camera frames and a small JSON header.

Layout of a route directory:
  header.json         format, version, camera config, generator, seed, duration, per-service counts, frame files
  log.zst             zstd-compressed stream of capnp `Event` messages, flat-array encoded and concatenated
                      (openpilot's rlog form); the writer closes a zstd frame every FLUSH_EVERY events, so a
                      killed logger still leaves a readable prefix
  fcamera.nv12z, ecamera.nv12z, dcamera.nv12z
                      one frame file per recorded camera (visionipc.framefile; names from its
                      STREAM_FILE_NAMES for the cameras "road", "wide", "cabin"), so camerad can play a route
                      directory directly

Invariants:
- Events are stored in arrival order; `Route.events()` returns them stably sorted by logMonoTime.
- Message boundaries come from the capnp segment table alone, so raw bytes can be split without the schema;
  a truncated or corrupt log is a RouteError naming the file and the byte offset.
- header.json is written when recording starts ("complete": false) and rewritten on close ("complete": true).
  A complete route with a damaged log is a RouteError; an incomplete one (the recorder was killed) yields
  the events of every whole zstd frame and sets `Route.recovered`.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Iterator

import zstandard

from cereal.messaging import log_from_bytes
from visionipc.framefile import STREAM_FILE_NAMES, FrameReader, FrameWriter

FORMAT = "pymodeld-route"
VERSION = 1
HEADER = "header.json"
LOG = "log.zst"
FLUSH_EVERY = 500

# camera name -> the service that carries its FrameData
CAMERAS = {"road": "narrowRoadCameraState", "wide": "wideRoadCameraState", "cabin": "cabinCameraState"}


class RouteError(Exception):
  """A route directory that is missing, incomplete, of another format or corrupt."""


def split_messages(data: bytes, name: str = "log") -> list[bytes]:
  """Split concatenated capnp flat-array messages using only their segment tables."""
  out, pos, n = [], 0, len(data)
  view = memoryview(data)
  while pos < n:
    if n - pos < 8:
      raise RouteError(f"{name}: truncated message header at byte {pos}")
    nseg = struct.unpack_from("<I", data, pos)[0] + 1
    header = 4 * (1 + nseg)
    header += header % 8
    if nseg > 512 or pos + header > n:
      raise RouteError(f"{name}: corrupt segment table at byte {pos} ({nseg} segments)")
    words = sum(struct.unpack_from(f"<{nseg}I", data, pos + 4))
    end = pos + header + 8 * words
    if end > n:
      raise RouteError(f"{name}: truncated message at byte {pos} (needs {end - pos} bytes, {n - pos} left)")
    out.append(bytes(view[pos:end]))
    pos = end
  return out


def _frame_file(camera: str) -> str:
  if camera not in CAMERAS:
    raise RouteError(f"unknown camera {camera!r}; known: {sorted(CAMERAS)}")
  return STREAM_FILE_NAMES[camera]


class RouteWriter:
  """Write a route: add_event(bytes) for each Event, add_frame(camera, ...) for each frame, then close()."""

  def __init__(self, path: str, camera: str, generator: str, seed: int | None = None, extra: dict | None = None,
               frame_level: int = 1):
    os.makedirs(path, exist_ok=True)
    self.frame_level = frame_level   # zstd level of the frame files (sample routes in git trade time for size)
    if os.path.exists(os.path.join(path, HEADER)):
      raise RouteError(f"{path} already holds a route; refusing to overwrite it")
    self.path = path
    self.header = {"format": FORMAT, "version": VERSION, "camera": camera, "generator": generator, "seed": seed,
                   "duration_s": 0.0, "events": 0, "services": {}, "cameras": {}, "complete": False,
                   **(extra or {})}
    self._write_header()
    self._log_file = open(os.path.join(path, LOG), "wb")
    self._log = zstandard.ZstdCompressor(level=3, write_checksum=True).stream_writer(self._log_file, closefd=False)
    self._frames: dict = {}
    self._since_flush = 0
    self._first_ns = self._last_ns = None
    self.closed = False

  def add_event(self, data: bytes, log_mono_time: int | None = None, service: str | None = None) -> None:
    """Append one serialized Event. Pass logMonoTime and the service name if known (saves a decode)."""
    if log_mono_time is None or service is None:
      evt = log_from_bytes(data)
      log_mono_time, service = evt.logMonoTime, evt.which()
    self._log.write(data)
    counts = self.header["services"]
    counts[service] = counts.get(service, 0) + 1
    self.header["events"] += 1
    self._first_ns = log_mono_time if self._first_ns is None else min(self._first_ns, log_mono_time)
    self._last_ns = log_mono_time if self._last_ns is None else max(self._last_ns, log_mono_time)
    self._since_flush += 1
    if self._since_flush >= FLUSH_EVERY:
      self._log.flush(zstandard.FLUSH_FRAME)
      self._log_file.flush()   # whole frames reach the file, so a killed recorder leaves a readable prefix
      self._since_flush = 0

  def add_frame(self, camera: str, data, frame_id: int, timestamp_sof: int, timestamp_eof: int,
                width: int, height: int, stride: int, uv_offset: int) -> None:
    """Append one NV12 frame (bytes-like, the whole padded buffer) to the camera's frame file.
    Different cameras may be written from different threads."""
    writer = self._frames.get(camera)
    if writer is None:
      fname = _frame_file(camera)
      size = memoryview(data).nbytes
      writer = FrameWriter(os.path.join(self.path, fname), width, height, stride, uv_offset, size, self.frame_level)
      self._frames[camera] = writer
      self.header["cameras"][camera] = {"file": fname, "width": width, "height": height, "frames": 0}
    writer.write(data, frame_id=frame_id, timestamp_sof=timestamp_sof, timestamp_eof=timestamp_eof)
    self.header["cameras"][camera]["frames"] += 1

  def close(self) -> None:
    if self.closed:
      return
    self.closed = True
    self._log.flush(zstandard.FLUSH_FRAME)
    self._log.close()
    self._log_file.close()
    for writer in self._frames.values():
      writer.close()
    if self._first_ns is not None:
      self.header["duration_s"] = round((self._last_ns - self._first_ns) / 1e9, 3)
      self.header["start_mono_ns"] = self._first_ns
    self.header["complete"] = True
    self._write_header()

  def _write_header(self) -> None:
    tmp = os.path.join(self.path, HEADER + ".tmp")
    with open(tmp, "w") as f:
      json.dump(self.header, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(self.path, HEADER))

  def __enter__(self) -> "RouteWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class Route:
  """Read a route: header, events in logMonoTime order, frames by camera and index."""

  def __init__(self, path: str):
    self.path = path
    header_path = os.path.join(path, HEADER)
    if not os.path.isfile(header_path):
      raise RouteError(f"{path} is not a route: no {HEADER} (missing, or the recording did not finish)")
    with open(header_path) as f:
      try:
        self.header = json.load(f)
      except json.JSONDecodeError as e:
        raise RouteError(f"{header_path}: not valid JSON ({e})") from None
    if self.header.get("format") != FORMAT or self.header.get("version") != VERSION:
      raise RouteError(f"{header_path}: format {self.header.get('format')!r} version {self.header.get('version')!r}; "
                       f"expected {FORMAT!r} version {VERSION}")
    self._readers: dict = {}
    self.recovered = False

  @property
  def camera(self) -> str:
    return self.header["camera"]

  @property
  def cameras(self) -> list[str]:
    return sorted(self.header["cameras"])

  def raw_events(self) -> list[bytes]:
    """Every serialized Event, in the order it was recorded."""
    log_path = os.path.join(self.path, LOG)
    with open(log_path, "rb") as f:
      compressed = f.read()
    parts, pos, dctx = [], 0, zstandard.ZstdDecompressor()
    while pos < len(compressed):
      dobj = dctx.decompressobj()
      try:
        out = dobj.decompress(compressed[pos:])
      except zstandard.ZstdError as e:
        out, error = b"", f"corrupt zstd frame at byte {pos} ({e})"
      else:
        error = None if dobj.eof else f"truncated zstd frame at byte {pos}"
      if error is not None:
        if self.header.get("complete", True):
          raise RouteError(f"{log_path}: {error}")
        self.recovered = True   # the recorder died mid-frame: keep the whole frames before it
        break
      parts.append(out)
      pos = len(compressed) - len(dobj.unused_data)
    return split_messages(b"".join(parts), log_path)

  def events(self) -> list:
    """Decoded Events (capnp readers), stably sorted by logMonoTime."""
    events = [log_from_bytes(raw) for raw in self.raw_events()]
    events.sort(key=lambda e: e.logMonoTime)
    return events

  def frames(self, camera: str):
    """The frame-file reader of one camera (len(), get(i) -> Frame(frame_id, timestamp_sof, timestamp_eof, data),
    iteration, frame_ids())."""
    if camera not in self.header["cameras"]:
      raise RouteError(f"route {self.path} has no frames for camera {camera!r}; it has {self.cameras}")
    reader = self._readers.get(camera)
    if reader is None:
      reader = FrameReader(os.path.join(self.path, self.header["cameras"][camera]["file"]))
      self._readers[camera] = reader
    return reader

  def frame(self, camera: str, index: int):
    return self.frames(camera).get(index)

  def close(self) -> None:
    for reader in self._readers.values():
      close = getattr(reader, "close", None)
      if close:
        close()
    self._readers.clear()

  def __enter__(self) -> "Route":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __iter__(self) -> Iterator:
    return iter(self.events())
