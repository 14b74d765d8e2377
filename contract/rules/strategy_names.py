"""The strategies a config can name (strategy.name), each with the compute-side class that implements it, as a
dotted name the ranks import only when chosen (train/strategies/): the launch refuses any other name. Data only.
"""

# strategy name -> "module:class"; the module is imported only when chosen (deepspeed is heavy and optional).
REGISTRY = {
    "single": "train.strategies.single:SingleStrategy",
    "ddp": "train.strategies.ddp:DDPStrategy",
    "fsdp": "train.strategies.fsdp:FSDPStrategy",
    "fsdp_grad_op": "train.strategies.fsdp:FSDPStrategy",
    "hsdp": "train.strategies.fsdp:FSDPStrategy",
    "zero1": "train.strategies.deepspeed:DeepSpeedStrategy",
    "zero2": "train.strategies.deepspeed:DeepSpeedStrategy",
    "zero3": "train.strategies.deepspeed:DeepSpeedStrategy",
    "zero3_offload": "train.strategies.deepspeed:DeepSpeedStrategy",
}
