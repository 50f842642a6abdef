"""The command-line programs, one module each, above the pure functions of `vit/` that they call:

    vit-train      vit.commands.train      (python train.py)   LightningCLI: fit, validate, test; the planner
    vit-predict    vit.commands.predict    (python predict.py) classify image files with a checkpoint
    vit-export     vit.commands.export     ONNX / TorchScript, with a sidecar JSON of the preprocessing
    vit-attention  vit.commands.attention  overlays for image files; `faithfulness`: deletion/insertion table
    vit-eval       vit.commands.eval       the evaluation report: metrics, predictions, figures, one page
    vit-serve      vit.commands.serve      a checkpoint or ONNX export behind HTTP (LitServe), with a page

Nothing in `vit/` outside this folder imports from it.
"""
