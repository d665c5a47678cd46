"""radserve.bench."""

# the reference pipeline every contestant of the benchmarks runs (one definition: the
# scenarios import it from here, a light module, so that processes started by a run do
# not load the phantom generator or ONNX Runtime for a name)
PIPELINE = "ct-chest-abdomen"
