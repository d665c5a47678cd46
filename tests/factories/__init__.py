"""Test data factories: synthetic volumes, DICOM series and tiny ONNX graphs."""
