"""Weights in and out of a run.

    init_weights.py   model.init_from: weights loaded into each rank's model before its strategy places it
    files.py          the shapes of weight files, read without loading them (safetensors headers, meta-device torch)
    export.py         a checkpoint's weights consolidated to one state dict and written (safetensors, Hugging Face)
"""
