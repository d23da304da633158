"""What every layer above the runtime uses: the one-line CLI errors and the stop idiom (cli), realtime scheduling
and pinning (realtime), the camera configs (cameras) and the calibration transforms (transforms). The daemons,
the stack's other processes (selfdrive_stub), process_replay and the benches import it; it imports only msgq and
the runtime."""
