"""Deployment: classifying image files with a trained checkpoint (predict.py), the HTTP server and its page
(serve.py), and export to ONNX / TorchScript with the preprocessing beside the graph (export.py)."""
