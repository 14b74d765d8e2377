"""Data both sides must agree on.

    manifest.py       a prepared dataset's on-disk format (manifest.json, shards): written by launcher.prepare
    shard_files.py    its shard files (and loss-mask shards) checked against the manifest
    sft.py            supervised fine-tuning records as segments (chat templates), the loss mask's format
    spec.py           data.path and data.sources resolved into sources: files, token counts, prepared manifests
    source_checks.py  can this model train on a source: token ids in range, a corpus named for what it is
    mixture.py        a mixture's apportionment: which source each global sample comes from
    documents.py      the documents of a window, from a prepared stream's end-of-document ids (data.document_mask)
    fingerprint.py    a dataset's fingerprint, saved with checkpoints and checked on resume
    run_tokenizer.py  the tokenizer a run trained with, from its config (launcher.sample, harness evaluation)
"""
