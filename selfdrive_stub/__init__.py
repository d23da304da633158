"""selfdrive_stub: everything around the model daemons that a PC run needs — the process manager, the camerad
stub (synthetic scenes or recorded frames over VisionIPC), a car/calibration stub, the safety consumers
(dmonitoringd, selfdrived) and the logger. Each is a real process speaking the real bus; none runs a model."""
