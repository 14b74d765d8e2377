"""`python -m launcher.prepare`: a corpus (text, JSON Lines, Parquet; compressed too) -> a prepared dataset.

  __main__.py   the command line: parse, check, then run locally or submit to SLURM
  inputs.py     finding input files (files, directories, globs) and reading their documents (binary skipped)
  filters.py    --include / --exclude: which files found in a directory are chosen
  tokenizer.py  loading a tokenizer (a local tokenizer.json or `bytes`) and its end-of-document id
  train_tokenizer.py  --train-tokenizer bpe:VOCAB: a BPE trained on the documents selected, saved as save_pretrained
                does, then prepared with
  plan.py       the preparation's identity and its tasks (deterministic groups of input files)
  shards.py     one task: read, split, tokenize, write its shards atomically, then its completion record
  sft_records.py  supervised fine-tuning records (--prompt-field/--response-field, --messages-field): read,
                checked, tokenized with their loss mask (written beside the shards)
  run.py        the local worker pool, resume and finalize (manifest.json written last)
  progress.py   a progress bar on a terminal, plain lines otherwise
  slurm.py      +cluster=NAME: the tasks as one SLURM CPU job array, then a finalize job
  container.py  container=RUNTIME with +cluster: those jobs in the training job's image (training's checks and
                command lines)
  jobs.py       a preparation's SLURM jobs (jobs.txt) and the refusal while one still runs
The on-disk format (manifest.json, shards) is the contract's: contract/data/manifest.py. Never imports torch.
"""
