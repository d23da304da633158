"""Tools beside the packages, never installed with them: the generators of the daemons' stand-in models
(`python -m tools.gen_road_models`, `python -m tools.gen_dm_model`). Run from the checkout."""
