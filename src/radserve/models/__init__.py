"""Model bundles: the manifest (model.yaml), the registry and the gate record (gate.json)."""
