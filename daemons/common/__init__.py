"""What both model daemons share: the frame loop and per-frame step skeleton (frame_loop), the runner protocol and
stage timings (runner), message building and timing fields (messages), calibration age in camera time
(calibration), env flags and BLAS threads (env), camera configs, transforms, warps, metadata, output numerics."""
