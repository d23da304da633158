"""The stack's supervisor: the manager and its processes, namespace ownership, the live view, the viewer and
the route logger."""
