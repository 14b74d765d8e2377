"""Weights in and out of a run.

    init_weights.py   model.init_from: weights loaded into each rank's model before its strategy places it
    fit.py            do model.init_from's weights fit the model (names, shapes), the first difference named
    files.py          weight files: their shapes read without loading them, their tensors one at a time
    hf_conversion.py  a Hugging Face checkpoint's tensors under the names of the model they load into
    hf_adapters.py    slurmtrain's transformer as LlamaForCausalLM / GPT2LMHeadModel hold it, and back
    export.py         a checkpoint's weights consolidated to one state dict and written as safetensors
    hf_export.py      a checkpoint as a self-contained Hugging Face directory, verified before it is renamed in
    hf_verify.py      that verification: the directory loaded back and compared with slurmtrain's model
    hf_tokenizer.py   the run's tokenizer beside it (a prepared dataset's, or an equivalent of `bytes`)
    final_export.py   checkpoint.export_hf=true: the final checkpoint's export at the end of training
"""
