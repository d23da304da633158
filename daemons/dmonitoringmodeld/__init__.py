"""dmonitoringmodeld: the cabin-camera driver-monitoring model daemon.

Invariants: the model's slices are validated at load; each processed cabin frame yields one driverStateV2 whose
`valid` is False (with invalidReason) on non-finite output, an overwritten frame, or missing/invalid/stale
calibration; frames are warped by the fixed 1440×960 luma warp (daemons/common/dm_warp.py).
Modules: parse (output decoding), model_state (the model: runner, metadata, inputs), core (per-frame step),
daemon (main loop), models/generate.py (the model file and how it is made). The runner and the frame loop are
the daemons' shared ones (daemons/common).
"""
