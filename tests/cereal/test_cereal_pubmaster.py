"""PubMaster: only a service's owner may publish it; sends are checked."""
import pytest

from cereal.messaging import (PROCESS_ENV, MultiplePublishersError, PubMaster, ServiceOwnershipError, SubMaster,
                              UnknownServiceError, log_from_bytes, new_message, sub_sock)


def test_owner_may_publish(monkeypatch):
  pm = PubMaster(["modelV2", "drivingModelData", "cameraOdometry"], process="modeld")
  assert set(pm.sock) == {"modelV2", "drivingModelData", "cameraOdometry"}
  pm.close()


def test_foreign_service_is_refused_naming_service_owner_and_caller():
  with pytest.raises(ServiceOwnershipError) as e:
    PubMaster(["modelV2", "carControl"], process="modeld")
  assert (e.value.service, e.value.owner, e.value.caller) == ("carControl", "car", "modeld")
  assert "'carControl'" in str(e.value) and "'car'" in str(e.value) and "'modeld'" in str(e.value)
  assert isinstance(e.value, PermissionError)


def test_process_defaults_to_the_env(monkeypatch):
  monkeypatch.setenv(PROCESS_ENV, "dmonitoringmodeld")
  pm = PubMaster(["driverStateV2"])
  assert pm.process == "dmonitoringmodeld"
  pm.close()
  with pytest.raises(ServiceOwnershipError, match="'selfdrived'"):
    PubMaster(["selfdriveState"])


def test_no_process_at_all_is_refused(monkeypatch):
  monkeypatch.delenv(PROCESS_ENV, raising=False)
  with pytest.raises(ServiceOwnershipError, match="PYMODELD_PROCESS"):
    PubMaster(["carState"])


def test_refusal_opens_no_socket(monkeypatch):
  # the allowed service listed first must not have been opened (and so not taken) by the refused PubMaster
  with pytest.raises(ServiceOwnershipError):
    PubMaster(["carState", "modelV2"], process="car")
  pm = PubMaster(["carState"], process="car")
  pm.close()


def test_allow_foreign_for_tools():
  pm = PubMaster(["carControl", "modelV2"], process="modeld", allow_foreign=True)
  pm.close()


def test_unknown_service_is_named():
  with pytest.raises(UnknownServiceError, match="'liveCalibration'"):
    PubMaster(["liveCalibration"], allow_foreign=True)


def test_send_checks_service_and_message():
  pm = PubMaster(["carState"], process="car")
  with pytest.raises(ValueError, match="carries 'carControl' but was sent on 'carState'"):
    pm.send("carState", new_message("carControl"))
  with pytest.raises(ValueError, match="'modelV2' was not opened"):
    pm.send("modelV2", new_message("modelV2"))
  pm.close()


def test_builder_and_bytes_both_arrive():
  sock = sub_sock("carState", timeout=5000)
  pm = PubMaster(["carState"], process="car")
  m = new_message("carState")
  m.carState.vEgo = 1.25
  pm.send("carState", m)
  pm.send("carState", new_message("carState", valid=False).to_bytes())
  first, second = sock.receive(), sock.receive()
  assert log_from_bytes(first).carState.vEgo == 1.25
  assert not log_from_bytes(second).valid
  pm.close()
  sock.close()


def test_second_publisher_is_refused():
  pm = PubMaster(["carState"], process="car")
  with pytest.raises(MultiplePublishersError, match="'carState'"):
    PubMaster(["carState"], process="car")
  pm.close()


def test_readers_updated():
  pm = PubMaster(["deviceState"], process="car")
  assert not pm.all_readers_updated("deviceState")  # no reader yet
  sm = SubMaster(["deviceState"])
  pm.send("deviceState", new_message("deviceState"))
  assert not pm.all_readers_updated("deviceState")
  sm.update(5000)
  assert pm.wait_for_readers_to_update("deviceState", timeout=10)
  assert sm.updated["deviceState"]
  sm.close()
  pm.close()
