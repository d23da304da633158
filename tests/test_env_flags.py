"""One boolean dialect: every on/off variable of every package, the runtime's included, takes 1/true/yes or
0/false/no in any case, treats unset or empty as its default, and refuses anything else naming the variable."""
import pytest

from cereal.messaging import SubMaster
from msgq import ipc
from msgq.env import EnvError
from runtime import config as runtime_config
from runtime import usb_amd


@pytest.mark.parametrize("word, on", [("1", True), ("TRUE", True), (" yes ", True), ("0", False), ("False", False),
                                      ("no", False)])
def test_every_flag_reads_the_same_words(monkeypatch, word, on):
  for name in ("ZMQ", "SIMULATION", "JIT", "PYMODELD_SEARCH", "PYMODELD_DISK_CACHE"):
    monkeypatch.setenv(name, word)
  assert ipc.zmq_enabled() is on
  assert SubMaster(["carState"]).simulation is on
  assert runtime_config.jit_enabled() is on and runtime_config.search_enabled() is on
  assert runtime_config.disk_cache_enabled() is on


def test_unset_or_empty_flags_are_their_defaults(monkeypatch):
  for name in ("ZMQ", "SIMULATION", "JIT", "PYMODELD_SEARCH", "PYMODELD_DISK_CACHE"):
    monkeypatch.setenv(name, "")
  assert not ipc.zmq_enabled() and not SubMaster(["carState"]).simulation
  assert runtime_config.jit_enabled() and runtime_config.disk_cache_enabled() and runtime_config.search_enabled()


def test_a_word_outside_the_dialect_is_an_error_naming_the_variable(monkeypatch):
  monkeypatch.setenv("ZMQ", "2")          # was read as "on": any value but '' or '0'
  with pytest.raises(EnvError, match="ZMQ must be 1/true/yes or 0/false/no, got '2'"):
    ipc.zmq_enabled()
  monkeypatch.setenv("SIMULATION", "on")  # was read as "off": only '1' counted
  with pytest.raises(EnvError, match="SIMULATION must be"):
    SubMaster(["carState"])
  monkeypatch.setenv("PYMODELD_SEARCH", "2")
  with pytest.raises(ValueError, match="PYMODELD_SEARCH must be 1/true/yes or 0/false/no, got '2'"):
    runtime_config.search_enabled()


def test_the_simulated_usb_device_reads_its_presence_in_the_same_words(monkeypatch):
  monkeypatch.setenv("PYMODELD_USB_AMD", "true")
  assert usb_amd.presence()[0]
  monkeypatch.setenv("PYMODELD_USB_AMD", "no")
  assert not usb_amd.presence()[0]
  monkeypatch.setenv("PYMODELD_USB_AMD", "present")
  present, why = usb_amd.presence()
  assert not present and "PYMODELD_USB_AMD must be 1/true/yes or 0/false/no" in why
