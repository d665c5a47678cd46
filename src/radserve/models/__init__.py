"""Model bundles: the manifest (model.yaml), the registry and the precision gate."""
