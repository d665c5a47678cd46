"""Pipeline definitions (``pipelines/<name>.yaml``): which models run, on which series."""
