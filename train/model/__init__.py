"""The models a run trains.

    transformer.py   slurmtrain's decoder-only transformer (GPT-2 and Llama style)
    mlp.py           the dense feed-forward (SwiGLU or GELU): the transformer's, and a MoE's shared experts
    moe.py           the mixture-of-experts feed-forward (model.moe): router, experts, auxiliary losses
    blocks.py        the repeated blocks of any model, found for FSDP, activation checkpointing and compile
    build.py         a model from its config (ours, a user's `_target_`, a Hugging Face config); logits of any
    float8.py        precision=fp8: the blocks' linear layers as torchao Float8Linear, checked on the rank's GPU
    fused_head.py    trainer.loss_impl=fused: the output layer's matmul and the loss together, no logits made
    hf.py            model=hf_causal_lm: a Hugging Face causal LM from a local config
    sample.py        generation from a checkpoint (launcher.sample)
    probe.py         what the launch plan needs to know of a user's model (python -m launcher.worker --probe)
    probe_build.py   building a user's model for the probe without the memory training takes
"""
