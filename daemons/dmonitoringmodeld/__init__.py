"""dmonitoringmodeld: the cabin-camera driver-monitoring model daemon.

Invariants: the model's slices are validated at load; each processed cabin frame yields one driverStateV2 whose
`valid` is False (with invalidReason) on an unusable output, an overwritten frame, or missing/invalid/stale
calibration; frames are warped by the fixed 1440×960 luma warp inside the frame program (daemons/common/dm_warp.py
has its geometry). Modules: parse (output decoding), model_state (the model: frame programs, metadata, calib),
programs (the frame programs), core (per-frame step), daemon (main loop); models/ holds the model file
(tools/gen_dm_model.py makes it). The frame loop and the frame programs are the daemons' shared ones
(daemons/common).
"""
