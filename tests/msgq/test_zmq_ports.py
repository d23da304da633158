"""ZMQ ports: outside the kernel's ephemeral port range (where outgoing connections take their local ports), never
shared by two services of one namespace, the same in every process; and a port found taken is blamed on whoever
really holds it."""
import os
import random
import socket
import time

import pytest

import msgq
from cereal.services import SERVICE_LIST
from msgq import zmq_backend
from msgq.namespace import Namespace
from msgq.zmq_backend import KNOWN_ENDPOINTS, ephemeral_range, port_for


@pytest.fixture
def zmq_mode(monkeypatch, namespace):
  monkeypatch.setenv("ZMQ", "1")
  return namespace.prefix


@pytest.fixture
def kernel_range(monkeypatch, tmp_path):
  """kernel_range("lo hi") makes the backend read that text as the ephemeral port range; None: no such file."""
  def use(text: str | None) -> None:
    path = tmp_path / "ip_local_port_range"
    if text is not None:
      path.write_text(text)
    monkeypatch.setattr(zmq_backend, "EPHEMERAL_RANGE_FILE", str(path))
  return use


def _namespaces(count: int = 2000) -> list[str]:
  rng = random.Random(20240611)  # fixed, so a failure names a prefix that fails again
  return [""] + [f"ns{rng.randrange(1 << 22)}_{rng.getrandbits(32):08x}" for _ in range(count - 1)]


def _proc_range() -> tuple[int, int]:
  try:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
      lo, hi = map(int, f.read().split())
    return lo, hi
  except OSError:
    return 32768, 60999


def test_no_service_port_of_2000_namespaces_falls_inside_the_kernels_ephemeral_port_range():
  lo, hi = _proc_range()
  inside = [(p, s, port) for p in _namespaces() for s in SERVICE_LIST if lo <= (port := port_for(s, prefix=p)) <= hi]
  assert inside == []


def test_no_two_services_of_one_namespace_share_a_port_in_2000_namespaces():
  for p in _namespaces():
    ports = [port_for(s, prefix=p) for s in SERVICE_LIST]
    assert len(set(ports)) == len(ports), p


def test_msgqs_table_of_known_endpoints_is_cereals_services_list():
  assert KNOWN_ENDPOINTS == set(SERVICE_LIST)


def test_an_endpoint_outside_the_services_table_never_takes_a_services_port():
  for p in _namespaces(200):
    services = {port_for(s, prefix=p) for s in SERVICE_LIST}
    for endpoint in ("zmq_test", "crossns", "carControl_like", f"adhoc_{p}"):
      assert port_for(endpoint, prefix=p) not in services, (p, endpoint)


def test_ports_avoid_the_range_the_kernel_reports_at_the_time_of_the_call(kernel_range):
  kernel_range("10000 20000\n")
  assert ephemeral_range() == (10000, 20000)
  ports = {port_for(s, prefix=p) for p in _namespaces(100) for s in SERVICE_LIST}
  assert not any(10000 <= port <= 20000 for port in ports)
  assert any(32768 <= port <= 60999 for port in ports)  # free again once the kernel no longer uses them
  assert all(8023 <= port <= 65535 for port in ports)


@pytest.mark.parametrize("text", [None, "", "garbage", "60999 32768"])
def test_an_unreadable_or_malformed_range_falls_back_to_the_linux_default(kernel_range, text):
  kernel_range(text)
  assert ephemeral_range() == (32768, 60999)


def test_a_range_that_leaves_too_few_ports_is_an_error_naming_the_sysctl(kernel_range):
  kernel_range("1024 65535")
  with pytest.raises(msgq.IpcError, match="ip_local_port_range"):
    port_for("modelV2", prefix="tight")


def _listen_when_free(port: int) -> socket.socket:
  """A plain TCP listener on 127.0.0.1:port, retried while a closed ZMQ socket's io thread still releases it."""
  for _ in range(200):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
      listener.bind(("127.0.0.1", port))
      listener.listen(1)
      return listener
    except OSError:
      listener.close()
      time.sleep(0.05)
  pytest.skip(f"port {port} stays in use by another program")


def test_a_port_held_by_a_foreign_listener_is_blamed_on_that_program_not_on_another_copy(zmq_mode):
  endpoint = "foreign"
  msgq.pub_sock(endpoint).close()  # a closed publisher must not be mistaken for a live copy
  listener = _listen_when_free(port_for(endpoint))
  try:
    with pytest.raises(msgq.MultiplePublishersError) as info:
      msgq.pub_sock(endpoint)
  finally:
    listener.close()
  message = str(info.value)
  assert f"port {port_for(endpoint)} is already bound by pid {os.getpid()}" in message
  assert "not by a publisher of this namespace" in message and "OPENPILOT_PREFIX" in message
  assert "another copy" not in message


def test_a_second_copy_in_another_process_is_named_with_its_pid_and_a_killed_one_blocks_nothing(zmq_mode, spawn_python):
  endpoint = "copied"
  child = spawn_python(f"""
    import time, msgq
    pub = msgq.pub_sock({endpoint!r})
    print("bound", flush=True)
    time.sleep(60)
  """)
  assert child.stdout.readline().strip() == "bound", child.stderr.read()
  with pytest.raises(msgq.MultiplePublishersError, match=f"another copy of its publisher \\(pid {child.pid}"):
    msgq.pub_sock(endpoint)
  child.kill()
  child.wait()
  msgq.pub_sock(endpoint).close()  # its claim outlives it but names a dead process: the port is free


def _same_port(kernel_range, find):
  """Narrow the candidates to 65001..65535 so a clash is quick to find; `find(port)` returns a clashing name."""
  kernel_range("8023 65000")
  port = port_for("clash")
  for i in range(20000):
    name = find(port, i)
    if name is not None:
      return port, name
  pytest.skip("no clash found")


def test_an_endpoint_whose_port_another_endpoint_of_the_namespace_holds_names_that_endpoint(zmq_mode, kernel_range):
  port, other = _same_port(kernel_range, lambda port, i: f"clash{i}" if i and port_for(f"clash{i}") == port else None)
  pub = msgq.pub_sock("clash")
  try:
    with pytest.raises(msgq.MultiplePublishersError, match=f"port {port} is already bound by this namespace's "
                       f"publisher of 'clash' \\(pid {os.getpid()}, this process\\)"):
      msgq.pub_sock(other)
  finally:
    pub.close()


def test_a_port_that_another_namespace_holds_names_that_namespace(zmq_mode, kernel_range):
  port, prefix = _same_port(kernel_range, lambda port, i: f"other{i}" if port_for("clash", prefix=f"other{i}") == port else None)
  pub = msgq.pub_sock("clash")
  try:
    with Namespace(prefix), pytest.raises(msgq.MultiplePublishersError) as info:
      msgq.pub_sock("clash")
  finally:
    pub.close()
  assert f"port {port} is already bound by the publisher of 'clash' in namespace {zmq_mode!r}" in str(info.value)
  assert "another copy" not in str(info.value)
