"""The optimizers torch does not step as we need them (train/optim.py builds every optimizer, these among them).

    sharded.py    a parameter's local shard (FSDP, TP) and the stability verdict's skip flag
    muon.py       Muon for the blocks' matrices, gathered whole under FSDP/TP for the orthogonalisation, AdamW
                  for the rest, as one optimizer (one state dict, one schedule, skipped steps on the device)
    adafactor.py  torch's Adafactor with out-of-place updates, which DTensor shards can take
    host_skip.py  torch's SGD over DTensors and lion-pytorch's Lion, the skip flag read on the host
"""
