"""msgq: pub/sub transport with the commaai/msgq Python API. See msgq/README.md for the ring's invariants."""
