"""Fixtures for VisionIPC tests: a server running in another process, driven command by command."""
import os
import select

import pytest
from visionipc import VisionIpcServer

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vipc_server_child.py")
REPLY_TIMEOUT_S = 30.0  # generous: only guards against a hung child on a loaded machine


class ServerProcess:
  def __init__(self, proc):
    self.proc = proc

  def cmd(self, line: str) -> str:
    self.begin(line)
    return self.reply(line)

  def begin(self, line: str) -> None:
    """Send a command without waiting for its answer (collect it with reply())."""
    self.proc.stdin.write(line + "\n")
    self.proc.stdin.flush()

  def reply(self, line: str) -> str:
    ready, _, _ = select.select([self.proc.stdout], [], [], REPLY_TIMEOUT_S)
    reply = self.proc.stdout.readline() if ready else ""
    if not reply.startswith("ok"):
      raise AssertionError(f"server child failed on {line!r}: {reply!r} {self.proc.stderr.read() if self.proc.poll() is not None else ''}")
    return reply[2:].strip()

  def start(self, streams: list[tuple[int, int, int, int, str]]) -> "ServerProcess":
    for stream, n, w, h, layout in streams:
      self.cmd(f"create {stream} {n} {w} {h} {layout}")
    self.cmd("listen")
    return self

  @property
  def server_id(self) -> int:
    return int(self.cmd("id"))


@pytest.fixture
def local_server():
  """local_server(num_buffers) -> an in-process VisionIpcServer "camerad" serving a tight 64x48 stream 0;
  closed after the test."""
  servers = []

  def make(num_buffers: int) -> VisionIpcServer:
    srv = VisionIpcServer("camerad")
    servers.append(srv)
    srv.create_buffers(0, num_buffers, 64, 48)
    srv.start_listener()
    return srv

  yield make
  for srv in servers:
    srv.close()


@pytest.fixture
def server_process(spawn_python):
  """server_process(name="camerad") -> ServerProcess (call .start([...]) to create streams and listen)."""
  import subprocess

  def start(name: str = "camerad") -> ServerProcess:
    code = f"import runpy, sys; sys.argv = [{CHILD!r}, {name!r}]; runpy.run_path({CHILD!r}, run_name='__main__')"
    return ServerProcess(spawn_python(code, stdin=subprocess.PIPE))

  return start
