"""Helpers shared by the model daemons: camera configs, transforms, warps, output parsing."""
