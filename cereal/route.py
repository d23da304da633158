"""Routes: one recorded drive on disk — the message log, the camera frames and a small JSON header.

Layout of a route directory:
  header.json         format, version, camera config, generator, seed, duration, per-service counts, the log's
                      decompressed size (log_bytes), frame files
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
- Writing never goes through a link: the route directory is created (0700) or must be a real directory of
  this user that other users cannot write; every file is created O_EXCL|O_NOFOLLOW relative to it, and the
  header is replaced by rename from a fresh temporary file. A planted file or link is a RouteError.
- A route is outside input. Reading opens only regular files, never through a symlink and never waiting on a
  FIFO; frame file names are plain names inside the route directory; the header's fields are type-checked;
  the log's decompressed size is capped (log_bytes from the header with a margin; for older or incomplete
  routes a bound from the event count or the compressed size; never above MAX_LOG_BYTES), so a small zstd
  bomb cannot grow the reader; errors name the problem and never echo a file's contents.
"""
from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import struct
from typing import Iterator

import zstandard

from cereal.messaging import log_from_bytes
from visionipc.framefile import MAX_DIMENSION, STREAM_FILE_NAMES, FrameFileError, FrameReader, FrameWriter, create_file, \
  open_regular

FORMAT = "pymodeld-route"
VERSION = 1
HEADER = "header.json"
LOG = "log.zst"
FLUSH_EVERY = 500
MAX_HEADER_BYTES = 1 << 20
MAX_LOG_BYTES = 1 << 30        # no route's log decompresses past this (about an hour of a whole stack)
EVENT_BYTES_BOUND = 16 << 10   # per event, for headers without log_bytes (the largest, modelV2, is ~8 KB)
INCOMPLETE_RATIO = 64          # an incomplete route's log may expand this much (ours compress ~2x)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LOG_CHUNK = 1024               # compressed bytes per decompress call: zstd expands one at most ~32768x

# camera name -> the service that carries its FrameData
CAMERAS = {"road": "narrowRoadCameraState", "wide": "wideRoadCameraState", "cabin": "cabinCameraState"}


class RouteError(Exception):
  """A route directory that is missing, incomplete, of another format, corrupt, or unsafe to write into."""


MIN_EVENT_WORDS = 2   # an Event is at least its root pointer and one data word (logMonoTime)


def split_messages(data: bytes, name: str = "log", max_count: int | None = None) -> list[bytes]:
  """Split concatenated capnp flat-array messages using only their segment tables. Each must be big enough to hold
  an Event, and there may be at most max_count of them, so the list (an object per message) stays within a small
  multiple of the bytes it came from: a log of empty messages cannot turn a capped size into gigabytes of objects."""
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
    if words < MIN_EVENT_WORDS:
      raise RouteError(f"{name}: message at byte {pos} has {words} words, too small to be an Event")
    if max_count is not None and len(out) >= max_count:
      raise RouteError(f"{name}: more than the {max_count} events its header declares")
    end = pos + header + 8 * words
    if end > n:
      raise RouteError(f"{name}: truncated message at byte {pos} (needs {end - pos} bytes, {n - pos} left)")
    out.append(bytes(view[pos:end]))
    pos = end
  return out


def decompress_log(compressed: bytes, cap: int, name: str, complete: bool = True, bound_by: str = "its size") -> tuple[bytes, bool]:
  """(bytes, recovered) of a zstd log of one or more frames (plain bytes pass through), never more than `cap`: it is
  decompressed a chunk at a time and refused (RouteError) as soon as it passes the cap. A damaged or truncated frame
  is a RouteError naming the frame's byte offset (a truncated one also says how many whole messages, and how many
  seconds of log, come before the cut); with complete=False (a recorder that died mid-frame) the whole
  frames before it are kept and recovered is True."""
  if compressed[:4] != ZSTD_MAGIC:
    if len(compressed) > cap:
      raise RouteError(f"{name}: {len(compressed)} bytes, more than {cap}")
    return bytes(compressed), False
  out = bytearray()
  pos, dctx = 0, zstandard.ZstdDecompressor()
  while pos < len(compressed):
    frame_start, before = pos, len(out)
    dobj, error = dctx.decompressobj(), None
    try:
      while not dobj.eof and pos < len(compressed):
        chunk = compressed[pos:pos + LOG_CHUNK]
        out += dobj.decompress(chunk)
        pos += len(chunk)
        if len(out) > cap:
          raise RouteError(f"{name}: decompresses to more than {cap} bytes, more than {bound_by} allows")
    except zstandard.ZstdError as e:
      error = f"corrupt zstd frame at byte {frame_start} ({e})"
    if error is None and not dobj.eof:
      error = (f"the log is truncated: the file ends at byte {len(compressed)}, partway through the zstd frame that "
               f"starts at byte {frame_start}; {_readable_before(out)}")
    if error is not None:
      if complete:
        raise RouteError(f"{name}: {error}")
      del out[before:]
      return bytes(out), True
    pos -= len(dobj.unused_data)
  return bytes(out), False


def _readable_before(data: bytes) -> str:
  """Where a truncated log's data ends, for its error: how many whole messages come before the cut and how far
  into the log the last of them is (its logMonoTime from the first's). Only the error text uses it: the scan
  stops at the first message that does not fit, and a time that does not decode is left out."""
  pos, bounds = 0, []
  while len(data) - pos >= 8:
    nseg = struct.unpack_from("<I", data, pos)[0] + 1
    header = 4 * (1 + nseg) + (4 * (1 + nseg)) % 8
    if nseg > 512 or pos + header > len(data):
      break
    words = sum(struct.unpack_from(f"<{nseg}I", data, pos + 4))
    end = pos + header + 8 * words
    if words < MIN_EVENT_WORDS or end > len(data):
      break
    bounds.append((pos, end))
    pos = end
  if not bounds:
    return "no whole message comes before the cut"
  text = f"the data stops after {len(bounds)} whole message{'s' if len(bounds) != 1 else ''}"
  try:
    first, last = (log_from_bytes(data[a:b]).logMonoTime for a, b in (bounds[0], bounds[-1]))
  except Exception:
    return text
  return f"{text}, {(last - first) / 1e9:.3f} s into the log"


def read_log(path: str, max_bytes: int = MAX_LOG_BYTES) -> list[bytes]:
  """The Events of a standalone log file (a reference or a copied log.zst): a regular file only (never a FIFO, a
  device or a link), at most max_bytes on disk, decompressed to at most INCOMPLETE_RATIO times that (and never past
  max_bytes). Bad input is a RouteError naming the file."""
  try:
    fd = open_regular(path)
  except FrameFileError as e:
    raise RouteError(str(e)) from None
  compressed = _read_capped(fd, path, "a log", max_bytes)
  cap = min(max_bytes, max(1 << 20, len(compressed) * INCOMPLETE_RATIO))
  data, _ = decompress_log(compressed, cap, path, True, f"{INCOMPLETE_RATIO}x its compressed size")
  return split_messages(data, path)


def _frame_file(camera: str) -> str:
  if camera not in CAMERAS:
    raise RouteError(f"unknown camera {camera!r}; known: {sorted(CAMERAS)}")
  return STREAM_FILE_NAMES[camera]


def _short(value) -> str:
  """repr of a header value, cut short: an error names it without reproducing a whole file."""
  text = repr(value)
  return text if len(text) <= 40 else text[:37] + "..."


def _writable_route_dir(path: str) -> int:
  """fd of the route directory: created 0700 if missing, else it must be a real directory (not a link) of this
  user that other users cannot write into."""
  try:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    os.mkdir(path, 0o700)
  except FileExistsError:
    pass
  except OSError as e:
    raise RouteError(f"{path}: cannot create the route directory ({e.strerror})") from None
  try:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
  except OSError as e:
    what = "a symlink" if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path) else "not a directory"
    raise RouteError(f"{path} is {what}; record into a directory of your own") from None
  st = os.fstat(fd)
  problem = ""
  if st.st_uid != os.geteuid():
    problem = f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
  elif st.st_mode & stat.S_IWOTH:
    problem = f"is writable by every user (mode {stat.S_IMODE(st.st_mode):o})"
  if problem:
    os.close(fd)
    raise RouteError(f"{path} {problem}; record into a private directory (a new path, or chmod o-w one you own)")
  return fd


def _read_dir(path: str) -> int:
  try:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
  except OSError as e:
    raise RouteError(f"{path} is not a route: {e.strerror}") from None


def _read_file(dir_fd: int, path: str, name: str, limit: int) -> bytes:
  """The whole of a regular file in the route directory, at most `limit` bytes."""
  try:
    fd = open_regular(name, dir_fd)
  except FrameFileError as e:
    raise RouteError(f"{os.path.join(path, name)}: {str(e).split(': ', 1)[-1]}") from None
  return _read_capped(fd, os.path.join(path, name), f"a route's {name}", limit)


def _read_capped(fd: int, where: str, what: str, limit: int) -> bytes:
  """All of the open regular file fd (taken over and closed), refused as RouteError when over limit bytes."""
  with os.fdopen(fd, "rb") as f:
    size = os.fstat(f.fileno()).st_size
    if size > limit:
      raise RouteError(f"{where} is {size} bytes, more than {what} may be ({limit})")
    return f.read(limit + 1)[:limit]


def _is_plain_name(name) -> bool:
  return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _count(value, lo: int = 0, hi: int | None = None) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= lo and (hi is None or value <= hi)


def check_header(header, where: str) -> None:
  """RouteError unless `header` is a route header whose fields have the types and ranges readers rely on."""
  if not isinstance(header, dict):
    raise RouteError(f"{where}: not a JSON object")
  if header.get("format") != FORMAT or header.get("version") != VERSION:
    raise RouteError(f"{where}: format {_short(header.get('format'))} version {_short(header.get('version'))}; "
                     f"expected {FORMAT!r} version {VERSION}")
  problems = []
  if not isinstance(header.get("camera"), str):
    problems.append("camera is not a string")
  for key in ("events", "log_bytes"):
    if key in header and not _count(header[key]):
      problems.append(f"{key} is not a non-negative integer")
  if not isinstance(header.get("complete", True), bool):
    problems.append("complete is not true/false")
  services = header.get("services", {})
  if not isinstance(services, dict) or not all(isinstance(k, str) and _count(v) for k, v in services.items()):
    problems.append("services is not an object of name -> count")
  cameras = header.get("cameras", {})
  if not isinstance(cameras, dict):
    problems.append("cameras is not an object")
    cameras = {}
  for cam, entry in cameras.items():
    if cam not in CAMERAS:
      problems.append(f"unknown camera {_short(cam)} (known: {', '.join(CAMERAS)})")
    elif not isinstance(entry, dict):
      problems.append(f"cameras.{cam} is not an object")
    elif not _is_plain_name(entry.get("file")):
      problems.append(f"cameras.{cam}.file {_short(entry.get('file'))} is not a plain file name inside the route")
    elif not all(_count(entry.get(k), 1, MAX_DIMENSION) for k in ("width", "height")):
      problems.append(f"cameras.{cam} width/height are not integers in 1..{MAX_DIMENSION}")
  if problems:
    raise RouteError(f"{where}: bad header: " + "; ".join(problems))


class RouteWriter:
  """Write a route: add_event(bytes) for each Event, add_frame(camera, ...) for each frame, then close()."""

  def __init__(self, path: str, camera: str, generator: str, seed: int | None = None, extra: dict | None = None,
               frame_level: int = 1):
    self.frame_level = frame_level   # zstd level of the frame files (sample routes in git trade time for size)
    self.path = path
    self._dir_fd = _writable_route_dir(path)
    self.closed = False
    try:
      if _entry_exists(HEADER, self._dir_fd):
        raise RouteError(f"{path} already holds a route; refusing to overwrite it")
      self.header = {"format": FORMAT, "version": VERSION, "camera": camera, "generator": generator, "seed": seed,
                     "duration_s": 0.0, "events": 0, "services": {}, "cameras": {}, "complete": False,
                     **(extra or {})}
      self._write_header()
      self._log_file = os.fdopen(self._create(LOG), "wb")
    except BaseException:
      os.close(self._dir_fd)
      raise
    self._log = zstandard.ZstdCompressor(level=3, write_checksum=True).stream_writer(self._log_file, closefd=False)
    self._log_bytes = 0
    self._frames: dict = {}
    self._since_flush = 0
    self._first_ns = self._last_ns = None

  def _create(self, name: str) -> int:
    try:
      return create_file(name, self._dir_fd, exclusive=True)
    except FrameFileError as e:
      raise RouteError(f"{os.path.join(self.path, name)}: {str(e).split(': ', 1)[-1]}") from None

  def add_event(self, data: bytes, log_mono_time: int | None = None, service: str | None = None) -> None:
    """Append one serialized Event. Pass logMonoTime and the service name if known (saves a decode)."""
    if log_mono_time is None or service is None:
      evt = log_from_bytes(data)
      log_mono_time, service = evt.logMonoTime, evt.which()
    self._log.write(data)
    self._log_bytes += len(data)
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
      try:
        writer = FrameWriter(fname, width, height, stride, uv_offset, size, self.frame_level, dir_fd=self._dir_fd,
                             exclusive=True)
      except FrameFileError as e:
        raise RouteError(f"{os.path.join(self.path, fname)}: {str(e).split(': ', 1)[-1]}") from None
      self._frames[camera] = writer
      self.header["cameras"][camera] = {"file": fname, "width": width, "height": height, "frames": 0}
    writer.write(data, frame_id=frame_id, timestamp_sof=timestamp_sof, timestamp_eof=timestamp_eof)
    self.header["cameras"][camera]["frames"] += 1

  def close(self) -> None:
    if self.closed:
      return
    self.closed = True
    try:
      self._log.flush(zstandard.FLUSH_FRAME)
      self._log.close()
      self._log_file.close()
      for writer in self._frames.values():
        writer.close()
      if self._first_ns is not None:
        self.header["duration_s"] = round((self._last_ns - self._first_ns) / 1e9, 3)
        self.header["start_mono_ns"] = self._first_ns
      self.header["log_bytes"] = self._log_bytes
      self.header["complete"] = True
      self._write_header()
    finally:
      os.close(self._dir_fd)

  def _write_header(self) -> None:
    """Replace header.json by rename from a new, randomly named file (so nothing planted is written through)."""
    data = json.dumps(self.header, indent=1, sort_keys=True).encode()
    tmp = f".{HEADER}.{secrets.token_hex(6)}.tmp"
    with os.fdopen(self._create(tmp), "wb") as f:
      f.write(data)
    os.replace(tmp, HEADER, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)

  def __enter__(self) -> "RouteWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _entry_exists(name: str, dir_fd: int) -> bool:
  try:
    os.lstat(name, dir_fd=dir_fd)
    return True
  except FileNotFoundError:
    return False


class Route:
  """Read a route: header, events in logMonoTime order, frames by camera and index."""

  def __init__(self, path: str, max_log_bytes: int = MAX_LOG_BYTES):
    self.path = path
    self.max_log_bytes = max_log_bytes
    header_path = os.path.join(path, HEADER)
    dir_fd = _read_dir(path)
    try:
      if not _entry_exists(HEADER, dir_fd):
        raise RouteError(f"{path} is not a route: no {HEADER} (missing, or the recording did not finish)")
      raw = _read_file(dir_fd, path, HEADER, MAX_HEADER_BYTES)
    finally:
      os.close(dir_fd)
    try:   # the errors name a position, never the text
      self.header = json.loads(raw)
    except json.JSONDecodeError as e:
      raise RouteError(f"{header_path}: not valid JSON ({e.msg} at byte {e.pos})") from None
    except UnicodeDecodeError as e:
      raise RouteError(f"{header_path}: not valid JSON (not UTF-8 at byte {e.start})") from None
    check_header(self.header, header_path)
    self._readers: dict = {}
    self.recovered = False

  @property
  def camera(self) -> str:
    return self.header["camera"]

  @property
  def cameras(self) -> list[str]:
    return sorted(self.header.get("cameras", {}))

  def log_cap(self, compressed_size: int) -> int:
    """The most bytes this route's log may decompress to (see the module invariants)."""
    h = self.header
    if "log_bytes" in h:
      bound = h["log_bytes"]
    elif h.get("complete", True):
      bound = h.get("events", 0) * EVENT_BYTES_BOUND
    else:
      bound = compressed_size * INCOMPLETE_RATIO
    return min(self.max_log_bytes, bound + max(1 << 20, bound // 8))

  def raw_events(self) -> list[bytes]:
    """Every serialized Event, in the order it was recorded."""
    log_path = os.path.join(self.path, LOG)
    dir_fd = _read_dir(self.path)
    try:
      compressed = _read_file(dir_fd, self.path, LOG, self.max_log_bytes)
    finally:
      os.close(dir_fd)
    h = self.header
    bound_by = f"its header ({'log_bytes ' + str(h['log_bytes']) if 'log_bytes' in h else 'events'})"
    data, recovered = decompress_log(compressed, self.log_cap(len(compressed)), log_path, h.get("complete", True), bound_by)
    self.recovered = self.recovered or recovered
    # a complete route's header counts its events; an incomplete one's is a lower bound, so it bounds nothing
    return split_messages(data, log_path, h.get("events") if h.get("complete", True) and "events" in h else None)

  def events(self) -> list:
    """Decoded Events (capnp readers), stably sorted by logMonoTime."""
    events = [log_from_bytes(raw) for raw in self.raw_events()]
    events.sort(key=lambda e: e.logMonoTime)
    return events

  def frames(self, camera: str):
    """The frame-file reader of one camera (len(), get(i) -> Frame(frame_id, timestamp_sof, timestamp_eof, data),
    iteration, frame_ids())."""
    if camera not in self.header.get("cameras", {}):
      raise RouteError(f"route {self.path} has no frames for camera {camera!r}; it has {self.cameras}")
    reader = self._readers.get(camera)
    if reader is None:
      entry = self.header["cameras"][camera]
      path = os.path.join(self.path, entry["file"])
      dir_fd = _read_dir(self.path)
      try:
        reader = FrameReader(path, fd=open_regular(entry["file"], dir_fd))
      except FrameFileError as e:
        raise RouteError(f"route {self.path}, camera {camera}: {str(e).replace(entry['file'] + ':', path + ':', 1)}") from None
      finally:
        os.close(dir_fd)
      g = reader.geometry
      if (g.width, g.height) != (entry["width"], entry["height"]):
        reader.close()
        raise RouteError(f"route {self.path}: {entry['file']} holds {g.width}x{g.height} frames, the header says "
                         f"{entry['width']}x{entry['height']}")
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
