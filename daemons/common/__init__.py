"""What both model daemons share: the frame loop and per-frame step skeleton (frame_loop), the frame programs and
their seam (frame_program, warp_program), stage timings (stage_times), message building and timing
fields (messages), calibration age in camera time (calibration), env flags and BLAS threads (env), camera
configs, transforms, warp geometry, metadata, output numerics."""
