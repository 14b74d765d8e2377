"""Bad input, as a user types it: every case exits 2 with one `error:` line that names the fix, and creates or
changes nothing (the project directory and the run root, byte for byte; nothing queued).

Each case runs `python -m launcher` in its own copy of examples/byo_project (a shell-hostile path, with its own
conf/, model.py, data.py and the files the cases point at), several cases at once: forked from a process that has
imported the launcher already (tests/forked_cli.py: the same command, a second less each), and a few of every kind
as real interpreters too, which must give the same result.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import copy_example, hq, launcher_env
from tests.forked_cli import run_module
from tests.prepared_data import write_prepared


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    expect: str  # in the one error line: what is wrong and the fix
    env: dict[str, str] = field(default_factory=dict)
    absent: str = ""  # must not be in the error line (a misleading suggestion)
    timeout: float = 300  # seconds: a refusal that takes longer fails the case


BYO = ("--config-dir", "conf")
CLUSTER = ("+cluster=local_slurm",)
CASES = [
    # -- config values ----------------------------------------------------------------------------------------
    # values echoed as typed (issue 36, item 7: a float key turned -1 into -1.0, 5000 into 5000.0)
    Case("lr-negative", ("optim.lr=-1",), "optim.lr=-1 is out of range: set optim.lr to a value above 0"),
    Case("lr-negative-exponent", ("optim.lr=-1e-3",), "optim.lr=-1e-3 is out of range: set optim.lr to a value"),
    Case("max-tokens-zero", ("trainer.max_tokens=0",), "trainer.max_tokens=0 is out of range"),
    Case("beta2-one", ("optim.beta2=1.0",), "set optim.beta2 to a value in [0, 1)"),
    Case("seed-negative", ("trainer.seed=-3",), "set trainer.seed to a value in [0, 4294967295]"),
    Case("dropout-nan", ("model.dropout=nan",), "set model.dropout to a finite value in [0, 1)"),
    Case("max-steps-zero", ("trainer.max_steps=0",), "set trainer.max_steps to a value at least 1"),
    Case("watchdog-factor", ("watchdog.factor=0.5",), "set watchdog.factor to a value at least 1"),
    Case("global-batch", ("trainer.global_batch_size=20", "local.nproc=2"), "pick a global batch that is a multiple "
                                                                          "of 16"),
    # Under tp the batch divides over the data-parallel ranks (2 of 4 here), and the message says so.
    Case("global-batch-tp", ("strategy=fsdp", "trainer.global_batch_size=8", "trainer.micro_batch_size=8", "local.nproc=4",
                             "parallel.tp=2", "model.tie_embeddings=false"),
         "trainer.micro_batch_size x data-parallel ranks = 8 x 2"),
    # A typo's size is refused as not fitting at once, not after walking a million layers' parameters (the generous
    # limit only tells a refusal from a hang; it is no timing).
    Case("layers-typo", ("model.n_layers=1000000",), "model=tiny with strategy=ddp does not fit: ", timeout=60),
    Case("heads-divide", ("model.d_model=65",), "model.d_model=65 is not divisible by model.n_heads=4"),
    # -- mixture of experts and expert parallelism ----------------------------------------------------------------
    Case("ep-experts", ("model=moe_tiny", "parallel.ep=3", "local.nproc=3"),
         "parallel.ep=3 does not divide model.moe.num_experts=4: each ep rank holds the same number of experts"),
    Case("moe-top-k", ("model=moe_tiny", "model.moe.top_k=5"), "set model.moe.top_k<=4"),
    Case("ep-dense", ("model=tiny", "parallel.ep=2", "local.nproc=2"),
         "parallel.ep=2 splits a mixture of experts and model=tiny is dense"),
    # model.moe.* on a model of its own code trained with routing metrics of experts it did not have
    Case("moe-own-model", (*BYO, "model=conv_lm", "data=chars", "model.moe.num_experts=4"),
         "model.moe.num_experts=4 shapes slurmtrain's own transformer, and model=conv_lm builds its model from "
         "model._target_"),
    Case("ep-own-model", (*BYO, "model=conv_lm", "data=chars", "parallel.ep=2", "local.nproc=2"),
         "parallel.ep=2 splits the experts of slurmtrain's own transformer, and model=conv_lm is built by "
         "model._target_, which ep does not split: use parallel.ep=1"),
    Case("lr-scaling-choice", ("optim.lr_scaling=cubic",), "is not one of none, linear, sqrt: set optim.lr_scaling"),
    Case("lr-scaling-reference", ("optim.lr_scaling=linear",), "add optim.reference_batch_size=N"),
    Case("verify-choice", ("checkpoint.verify=fast",), "checkpoint.verify=fast is not one of size, full"),
    Case("unknown-key", ("+trainer.foo=1",), "trainer.foo is not a slurmtrain key: drop +trainer.foo"),
    Case("misspelled-key", ("trainer.max_step=3",), "did you mean trainer.max_steps?"),
    Case("wrong-type", ("trainer.max_steps=many",), "trainer.max_steps takes a whole number and 'many' is "
                                                         "not one: write trainer.max_steps=N"),
    # an integer key typed as a float: the integer meant is the fix (it said "Value '100.0' of type 'float' could not
    # be converted to Integer")
    Case("int-as-exponent", ("data.seq_len=1e2",), "data.seq_len takes an integer, and 1e2 reads as the float 100.0: "
                                                   "write data.seq_len=100"),
    Case("int-fraction", ("trainer.max_steps=2.5",), "trainer.max_steps takes an integer: give a whole number (2 or 3)"),
    Case("group-choice", ("strategy=nope",), "choose strategy= one of auto, ddp"),
    Case("group-choice-typo", ("model=moe_tyni",), "did you mean model=moe_tiny? choose model= one of"),
    Case("grammar", ("model.d_model=[1",), "write overrides as key=value"),
    Case("section-removed", ("~model",), "model is required and was removed (~model): choose one with model=NAME"),
    Case("seq-len-context", ("data.seq_len=128",), "set data.seq_len<=64"),
    Case("single-many-ranks", ("strategy=single", "local.nproc=2"), "use strategy=ddp"),
    Case("zero-stage", ("strategy=zero2", "strategy.zero_stage=5"), "set strategy.zero_stage to a value in [0, 3]"),
    Case("hsdp-degree", ("strategy=hsdp", "local.nproc=2", "strategy.replicate_degree=3"), "pick a divisor of 2"),
    Case("run-name-slash", ("run.name=a/b",), "drop the slashes"),
    # -- paths and files ----------------------------------------------------------------------------------------
    # A relative path is named as the launch made it: absolute, against the project (the launch directory).
    Case("tokens-no-path", ("data=tokens",), "add data.path=/path/to/tokens.bin"),
    Case("tokens-missing", ("data=tokens", "data.path=missing.bin"),
         "my project's dir/missing.bin does not exist: point"),
    Case("tokens-directory", ("data=tokens", "data.path=conf"), "is not a regular file"),
    Case("tokens-odd-size", ("data=tokens", "data.path=odd.bin"), "not a whole number of data.dtype=uint16 tokens"),
    Case("tokens-empty", ("data=tokens", "data.path=empty.bin"), "my project's dir/empty.bin is empty"),
    Case("tokens-short", ("data=tokens", "data.path=short.bin"), "fewer than one sample (data.seq_len + 1 = 65): "
                                                                 "lower data.seq_len"),
    Case("tokens-vocab", ("data=tokens", "data.path=tokens.bin"), "holds token id 999, outside the vocabulary of "
                                                                  "model.vocab_size=256"),
    Case("tokens-dtype", ("data=tokens", "data.path=tokens.bin", "model.vocab_size=1000", "data.dtype=float32"),
         "data.dtype=float32 is not one of"),
    Case("run-root-file", ("run.root=odd.bin",), "my project's dir/odd.bin is a file, not a directory"),
    Case("run-root-in-file", ("run.root=odd.bin/runs",), "lies inside a file"),
    Case("hf-no-config", ("model=hf_causal_lm",), "add model.config_path=PATH"),
    Case("hf-bad-json", ("model=hf_causal_lm", "model.config_path=broken.json"), "is not a readable JSON config"),
    Case("hf-not-hf", ("model=hf_causal_lm", "model.config_path=plain.json"), "has no model_type"),
    Case("config-dir-missing", ("--config-dir", "no_such_conf"), "point --config-dir at your project's conf"),
    # -- a user's model and data (asked of them at launch) --------------------------------------------------------
    Case("target-module", ("model._target_=nosuchmod.Net",), "can't be imported: run from the directory"),
    Case("target-attribute", (*BYO, "model=conv_lm", "model._target_=model.Nope"), "model has no Nope: check the name"),
    Case("data-target", (*BYO, "model=conv_lm", "data=chars", "data._target_=data.Missing"), "data has no Missing"),
    Case("hf-config-missing", ("model=hf_causal_lm", "model.config_path=nowhere.json"), "no such config file"),
    Case("target-args", (*BYO, "model=conv_lm", "+model.args.width=3"), "does not take these arguments"),
    Case("data-args", (*BYO, "model=conv_lm", "data=chars", "+data.args.lenght=3"), "fix data.args"),
    Case("data-sample-length", (*BYO, "model=conv_lm", "data=chars", "data.args.seq_len=48"),
         "make the dataset return 65 or set data.seq_len=48"),
    Case("data-file", (*BYO, "model=conv_lm", "data=chars", "data.args.path=missing.txt"),
         "could not give its first sample (FileNotFoundError"),
    Case("data-vocab", (*BYO, "model=conv_lm", "data=chars", "model.args.vocab_size=64"),
         "but the model embeds only 64 ids"),
    Case("model-vocab", (*BYO, "model=conv_lm", "model.args.vocab_size=64"), "set model.vocab_size=64"),
    Case("block-name", (*BYO, "model=conv_lm", "model.block=Attention"), "names no module of this model: pick one of Conv1d, ConvBlock"),
    Case("ac-without-blocks", (*BYO, "model=conv_lm", "model.block=none", "strategy.activation_checkpointing=true"),
         "name the block class with model.block=ClassName"),
    # -- credentials ----------------------------------------------------------------------------------------------
    Case("online-no-key", ("logger.mode=online",), "run `wandb login`, or use logger.mode=offline"),
    Case("online-bad-key", ("logger.mode=online",), "WANDB_API_KEY is empty or holds whitespace",
         env={"WANDB_API_KEY": "abc def"}),
    Case("secret-in-cluster-env", (*CLUSTER, "+cluster.env.WANDB_API_KEY=abc"), "secrets are never written into "
                                                                              "sbatch scripts"),
    # -- cluster settings -----------------------------------------------------------------------------------------
    Case("cluster-missing", ("+cluster=nope",), "choose +cluster= one of"),
    Case("cluster-torchrun", (*CLUSTER, "cluster.launch=torchrun"), "use cluster.launch=srun"),
    Case("cluster-time-limit", (*CLUSTER, "cluster.time_limit_min=1"), "raise cluster.time_limit_min above 2"),
    Case("cluster-signal", (*CLUSTER, "cluster.signal=KILL"), "is not a signal the ranks can catch: use USR1"),
    Case("cluster-nodes", (*CLUSTER, "cluster.nodes=0"), "set cluster.nodes to a value at least 1"),
    Case("cluster-mfu", ("+cluster=a100x16", "cluster.assumed_mfu=2"), "set cluster.assumed_mfu to a value in (0, 1]"),
    Case("cluster-nccl", ("+cluster=a100x16", "cluster.nccl_async_error_handling=7"),
         "set cluster.nccl_async_error_handling to a value in [0, 3]"),
    # -- sweeps ---------------------------------------------------------------------------------------------------
    Case("sweep-point", ("-m", "local.nproc=2", "trainer.global_batch_size=16,20"),
         "sweep point 1 (trainer.global_batch_size=20)"),
    Case("sweep-range", ("-m", "optim.lr=1e-3,-1"), "optim.lr=-1 is out of range"),
    Case("sweep-name", ("-m", "trainer.seed=1,2", "launcher.sweep_name=a/b"), "launcher.sweep_name"),
    Case("sweep-same-dir", ("-m", "trainer.seed=1,2", "run.name=same"), "same"),
    Case("free-form-key", (*BYO, "model=conv_lm", "model.args.width=3"), "add it with +model.args.width=3"),
    Case("lr-infinite", ("optim.lr=inf",), "optim.lr=inf is out of range: set optim.lr to a finite value above 0"),
    Case("precision-name", ("precision.name=bf16",), "choose the group, precision=bf16"),
    # precision=fp8 (issue 35 acceptance 3): refused without float8 tensor cores, before anything is created.
    Case("fp8-no-gpu", ("precision=fp8",), "precision=fp8 needs an NVIDIA GPU of compute capability 9.0 or newer "
         "(H100, H200, B200), and this machine has none", env={"CUDA_VISIBLE_DEVICES": ""}),
    Case("fp8-cluster-gpu", ("+cluster=a100x16", "precision=fp8"), "and cluster a100x16 has a100_80gb: run on Hopper "
         "or newer (+cluster=h100x8), or use precision=bf16"),
    # strategy.compile's unit and CUDA graphs (issue 35 item 3): refused where they can't be honoured, saying why.
    Case("cuda-graphs-cpu", ("strategy.compile=true", "strategy.cuda_graphs=true"), "strategy.cuda_graphs=true needs "
         "the ranks on NVIDIA GPUs, and these run on CPUs: drop it"),
    Case("cuda-graphs-fsdp", ("+cluster=h100x8", "strategy=fsdp", "strategy.compile=true", "strategy.cuda_graphs=true"),
         "FSDP2 all-gathers each block's parameters into fresh memory every step"),
    Case("compile-model-fsdp", ("strategy=fsdp", "strategy.compile=true", "strategy.compile_unit=model"),
         "strategy.compile_unit=model compiles the model as one graph, and strategy=fsdp wraps or splits it"),
    Case("fp8-odd-dims", ("+cluster=h100x8", "precision=fp8", "model.d_model=72"), "precision=fp8 needs every "
         "dimension of the blocks' linear layers divisible by 16"),
    Case("local-nccl", ("local.backend=nccl",), "local.backend=nccl needs GPUs and this machine has none"),
    Case("tilde-path", ("data=tokens", "data.path=~/x.bin"), "quote a path that starts with ~"),
    Case("cluster-key-alone", ("cluster.nodes=2",), "add +cluster=NAME (or +profile=default) before its keys"),
    Case("cluster-extra-sbatch", (*CLUSTER, "+cluster.extra_sbatch.time=10"), "drop it and set that key instead"),
    Case("cluster-tasks-gpus", ("+cluster=a100x16", "cluster.tasks_per_node=3"), "one rank per GPU"),
    Case("cluster-term", (*CLUSTER, "cluster.signal=TERM"), "cluster.signal=TERM is not a signal the ranks can catch"),
    Case("sweep-empty", ("-m", "trainer.seed=range(1,1)"), "the sweep has no points"),
    Case("sweep-misspelled", ("-m", "trainer.max_stepz=1,2"), "sweep point 0 (trainer.max_stepz=1): "
                                                              "trainer.max_stepz is not a slurmtrain key"),
    Case("sweep-parent-name", ("-m", "trainer.seed=1,2", "launcher.sweep_name=.."), "launcher.sweep_name='..'"),
    Case("parallel-tp-heads", ("local.nproc=2", "strategy=fsdp", "parallel.tp=2", "model.n_kv_heads=1",
                               "model.tie_embeddings=false"), "pick a tp that divides both"),
    Case("sweep-grammar", ("-m", "trainer.seed=1,[2"), "expecting {COMMA, BRACKET_CLOSE}: write overrides as"),
    # -- names that would not say what trains; suggestions that point the wrong way ------------------------------
    Case("optim-name", ("optim.name=lamb",), "optim.name=lamb is not an optimizer slurmtrain implements (one of "
                                             "adamw, sgd, adafactor, muon, lion): choose one of those"),
    Case("optim-name-option", ("optim.name=sgd",), "choose the group, optim=sgd (not optim.name=...)"),
    # -- optimizers: a key the chosen one does not read, a kind weight decay can't skip, a strategy that can't step it
    Case("optim-unread-key", ("optim=sgd", "optim.beta1=0.8"), "optim.beta1=0.8 has no effect on optim=sgd (adamw, "
                                                               "muon, lion read it): drop it or choose one of those"),
    Case("optim-unread-own-key", ("optim.momentum=0.9",), "optim.momentum=0.9 has no effect on optim=adamw (sgd, "
                                                          "muon read it)"),
    Case("optim-no-decay-kind", ("optim.no_decay=[norms]",), "optim.no_decay names norms, which is not one of norm, "
                                                             "bias, embedding, vector"),
    Case("optim-zero-muon", ("optim=muon", "strategy=zero2"), "optim=muon with strategy=zero2: DeepSpeed steps flat "
                                                              "1-D partitions and muon orthogonalises each matrix; "
                                                              "use strategy=fsdp"),
    Case("optim-offload-sgd", ("optim=sgd", "strategy=zero3_offload"), "optim=sgd with strategy=zero3_offload: "
                                                                       "ZeRO-Offload steps only DeepSpeed's CPU Adam"),
    Case("model-name-option", ("model.name=llama3_8b",), "choose the group, model=llama3_8b (not model.name=...)"),
    Case("model-name-label", ("model.name=mine",), "name the run with run.name=mine"),
    Case("data-name", ("data.name=foo",), "data.name=foo is not a data source slurmtrain reads (synthetic, tokens)"),
    Case("data-name-option", ("data.name=tokens",), "choose the group, data=tokens (not data.name=...)"),
    Case("strategy-name", ("strategy.name=fsdp",), "choose the group, strategy=fsdp (not strategy.name=...)"),
    Case("new-key-unrelated", ("+trainer.eval_every=10",), "trainer.eval_every is not a slurmtrain key: did you "
                                                           "mean eval.every? drop +trainer.eval_every=10",
         absent="log_every"),
    Case("key-other-section", ("trainer.lr=0.1",), "trainer.lr is not a slurmtrain key: did you mean optim.lr?"),
    Case("key-other-tool", ("optim.learning_rate=0.1",), "optim.learning_rate is not a slurmtrain key: did you mean "
                                                         "optim.lr?"),
    Case("choice-close", ("logger.mode=onlin",), "is not one of offline, online, disabled: set logger.mode=online"),
    Case("args-without-target", ("+model.args.x=1",), "model=tiny takes none: drop +model.args.x=1"),
    Case("name-as-chosen", ("model=gpt2_124m", "model.name=gpt2_124m"), "is what model=gpt2_124m sets already: drop "
                                                                        "model.name=gpt2_124m"),
    Case("interpolation", ("optim.lr=${optim.nope}",), "optim.lr: Interpolation key 'optim.nope' not found: point "
                                                        "the ${...} at a key that exists"),
    Case("run-config-dir", ("run.name=confdir",), "config.yaml is not a file: move it away"),
    Case("new-section", ("+validation.every=10",), "validation.every is not a slurmtrain key: drop "
                                                   "+validation.every=10 (", absent="+validation="),
    Case("plus-on-a-key", ("+eval.every=10",), "eval.every is a slurmtrain key already: drop the + (eval.every=10)"),
    Case("key-unrelated", ("trainer.save_every=10",), "trainer.save_every is not a slurmtrain key: did you mean "
                                                       "trainer.ckpt_every?",
         absent="log_every"),
    Case("tokens-text", ("data=tokens", "data.path=corpus.txt"), "looks like UTF-8 text, not token ids: tokenize it"),
    Case("project-yaml-syntax", (*BYO, "model=broken"), "conf/model/broken.yaml, line 3, column 13: while "
         "parsing a flow sequence, expected ',' or ']', but got '}' (line 3, column 16): fix the YAML there"),
    # -- run directories that hold a run ------------------------------------------------------------------------
    Case("past-max-steps", ("run.name=done", "trainer.max_steps=50"), "is already at step 200 (its newest "
                                                                      "checkpoint), past trainer.max_steps=50"),
    Case("other-settings", ("run.name=done", "optim.lr=0.001"), "holds a run with other training settings "
                                                                "(optim.lr: 0.003 -> 0.001): pick another run.name"),
    Case("damaged-config", ("run.name=damaged",), "config.yaml is damaged (line 2, column 9: while parsing a flow "
                                                  "sequence"),
    # -- a user's model that the strategy can't train (tests/fixtures/user_models.py) ------------------------------
    Case("zero-scalar-param", ("model._target_=tests.fixtures.user_models.ScaledLM", "+model.args.vocab_size=256",
                               "strategy=zero2"), "strategy=zero2 can't train 0-dim parameters (temperature, "
                                                  "layers.0.gain, layers.1.gain): make each a 1-element tensor"),
    Case("ddp-unused-param", ("model._target_=tests.fixtures.user_models.UnusedLM", "+model.args.vocab_size=256",
                              "strategy=ddp", "local.nproc=2"), "the model's forward does not use other_head.weight, "
                                                                "other_head.bias: remove them or freeze them"),
    Case("fsdp-mixed-dtypes", ("model._target_=tests.fixtures.user_models.MixedLM", "+model.args.vocab_size=256",
                               "strategy=fsdp"), "layers.0.norm.weight (float32) differs from layers.0.up.weight "
                                                 "(bfloat16): cast the model to one dtype"),
    # -- prepared datasets and mixtures (tests/prepared_data.py) --------------------------------------------------
    Case("prepared-vocab", ("data=tokens", "data.path=prepared_big"), "my project's dir/prepared_big was prepared with a "
         "vocabulary of 300 ids (tokenizer big) but model.vocab_size=256: set model.vocab_size=300"),
    Case("data-changed", ("data=tokens", "data.path=tokens.bin", "model.vocab_size=1000", "run.name=copied"),
         "copied's checkpoint at step 5 was trained on other data (data.path: 000000000000 -> "),
    Case("mixture-negative", ("data=tokens", "model.vocab_size=1000", "data.sources.a.path=tokens.bin",
                              "data.sources.a.weight=-1"), "data.sources.a.weight=-1 is negative: give every source a "
                                                           "weight >= 0"),
    Case("mixture-zero", ("data=tokens", "model.vocab_size=1000", "data.sources.a.path=tokens.bin",
                          "data.sources.a.weight=0", "data.sources.b.path=tokens.bin", "data.sources.b.weight=0.0"),
         "data.sources weights are all zero (a, b): give at least one source a positive weight"),
    Case("mixture-missing", ("data=tokens", "model.vocab_size=1000", "data.sources.a.path=tokens.bin",
                             "data.sources.b.path=nowhere"), "my project's dir/nowhere does not exist: point "
                                                             "data.sources.b.path at a token file"),
    Case("mixture-tokenizers", ("data=tokens", "model.vocab_size=300", "data.sources.a.path=prepared_big",
                                "data.sources.b.path=prepared_bytes"), "data.sources.a and data.sources.b were "
         "prepared with different tokenizers (big, vocabulary 300; bytes, vocabulary 257)"),
    Case("mixture-data-group", ("data.sources.a.path=tokens.bin",), "data.sources mixes token data on disk, which "
                                                                    "data=synthetic does not read: add data=tokens"),
    Case("path-data-group", ("data.path=prepared_bytes",), "my project's dir/prepared_bytes is token data on disk, "
                                                          "which data=synthetic does not read: add data=tokens"),
    # -- learning-rate schedules (contract/rules/schedules.py, launcher/plan/lr_schedule.py) ------------------------------------
    Case("schedule-choice", ("optim.schedule=cosin",), "optim.schedule=cosin is not one of cosine, linear, constant, "
                                                       "wsd, inverse_sqrt: set optim.schedule=cosine"),
    Case("decay-shape-choice", ("optim.schedule=wsd", "optim.decay_shape=sqrt"), "optim.decay_shape=sqrt is not one "
                                                                                 "of 1-sqrt, linear, cosine"),
    Case("decay-start-past-end", ("optim.schedule=wsd", "optim.decay_start_step=120"), "optim.decay_start_step=120 "
         "is past trainer.max_steps=100: set optim.decay_start_step<=100"),
    Case("decay-start-in-warmup", ("optim.schedule=wsd", "optim.decay_start_step=3"), "optim.decay_start_step=3 is "
         "inside the warmup (optim.warmup_steps=5): set optim.decay_start_step>=5"),
    Case("decay-overlaps-warmup", ("optim.schedule=wsd", "optim.decay_fraction=0.98"), "optim.warmup_steps=5 and the "
         "decay (optim.decay_fraction=0.98 of trainer.max_steps=100 = 98 steps) overlap"),
    Case("schedule-ignores-key", ("optim.decay_start_step=50",), "optim.decay_start_step=50 has no effect on "
         "optim.schedule=cosine (only optim.schedule=wsd reads it): drop it or set optim.schedule=wsd"),
    Case("inverse-sqrt-timescale", ("optim.schedule=inverse_sqrt", "optim.warmup_steps=0"), "optim.schedule="
         "inverse_sqrt without warmup needs a timescale: set optim.timescale=N"),
    # -- validation (eval.*) ----------------------------------------------------------------------------------
    Case("eval-jobs-with-pipeline", ("eval.async_jobs=true", "+cluster=local_slurm", "parallel.pp=2",
                                     "cluster.nodes=2", "trainer.micro_batch_size=1", "model.tie_embeddings=false"),
         "evaluation jobs have no pipeline layout yet; set eval.async_jobs=false and eval.every=N"),
    Case("eval-kind-unknown", ("eval.every=5", "eval.sets.held.kind=heldout"),
         "eval.sets.held.kind=heldout must be one of val, tokens, synthetic, dataset"),
    Case("eval-set-key-unknown", ("eval.every=5", "eval.sets.held.pth=x"),
         "eval.sets.held.pth is not a key of a validation set"),
    Case("eval-tokens-no-path", ("eval.every=5", "eval.sets.held.kind=tokens"),
         "eval.sets.held.kind=tokens needs eval.sets.held.path=FILE"),
    Case("eval-every-negative", ("eval.every=-1",), "set eval.every to a value at least 0"),
    # -- a new user's trial (issue 48, fourth round): accepted in silence, or refused in a library's words --------
    Case("eval-batches-unread", ("eval.batches=3",), "eval.batches=3 has no effect with eval.every=0 (no "
                                                     "validation) (nothing else reads it): drop it, or set eval.every=N"),
    Case("telemetry-unread", ("telemetry.enabled=false", "telemetry.straggler_intervals=5"),
         "telemetry.straggler_intervals=5 has no effect with telemetry.enabled=false"),
    Case("zero-stage-contradicts", ("strategy=zero3", "strategy.zero_stage=1"), "strategy.zero_stage=1 contradicts "
         "strategy=zero3 (ZeRO stage 3): choose strategy=zero1 and drop strategy.zero_stage"),
    # the batch check named "a multiple of 32", which the resume check then refused: both keep the saved batch
    Case("resume-batch", ("run.name=done", "local.nproc=4", "trainer.global_batch_size=8", "trainer.max_steps=300"),
         "set trainer.micro_batch_size=2 (8 = 2 x 4 data-parallel rank(s) x 1 accumulation step(s)); the run being "
         "resumed keeps trainer.global_batch_size=8", absent="multiple of"),
    Case("cluster-without-plus", ("cluster=local_slurm",), "cluster=local_slurm: cluster has no default to override, "
                                                           "so it is added with a +: write +cluster=local_slurm"),
    Case("cluster-without-plus-unknown", ("cluster=nope",), "write +cluster=NAME, NAME one of a100x16, "),
    Case("strategy-with-plus", ("+strategy=fsdp",), "+strategy=fsdp: strategy has a default (ddp), so it is chosen "
                                                    "without a +: write strategy=fsdp"),
    Case("model-with-plus", ("+model=tiny",), "+model=tiny: model has a default (tiny), so it is chosen without a +"),
    Case("model-with-plus-unknown", ("+model=nope",), "+model=nope: no model option nope, and model is chosen "
                                                      "without a +: write model=NAME, NAME one of gpt2_124m, "),
    Case("dict-key-misspelled", ("trainer={max_stesp:5}",), "trainer.max_stesp is not a slurmtrain key: did you mean "
                                                            "trainer.max_steps?"),
    Case("dict-value-type", ("trainer={max_steps:abc}",), "trainer.max_steps takes a whole number and 'abc' is not "
                                                          "one: write trainer.max_steps=N"),
    Case("remote-port-type", ("+remote=local_sshd", "remote.port=abc"), "remote.port=abc: remote.port takes an "
                                                                        "integer port 1-65535 (ssh -p)"),
    Case("cfg-choice", ("--cfg", "jbo"), "--cfg jbo is not one of job, hydra, all: did you mean --cfg job?"),
]


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file and directory below `folder` (byte content by hash), so that any change shows."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if "__pycache__" in rel:
            continue  # Python's own cache, written by importing the project's modules
        out[rel] = hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


@functools.cache
def _saved_config() -> str:
    """config.yaml of a run of the default settings, as the launcher writes it."""
    from omegaconf import OmegaConf

    from launcher.compose import compose_and_plan
    from launcher.run.rundir import config_yaml

    cfg, _ = compose_and_plan(["run.name=done"])
    return config_yaml(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]


def _fake_run(run_dir: Path, config: str, step: int) -> None:
    """A run directory with a complete checkpoint at `step` (what the launch checks read of it)."""
    ckpt = run_dir / "checkpoints" / f"step_{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "COMPLETE").write_text(json.dumps({"step": step, "world_size": 1}))
    (ckpt / "config.yaml").write_text(_saved_config())
    (run_dir / "config.yaml").write_text(config)


def _make_files(project: Path) -> None:
    np.arange(1000, dtype=np.uint16).tofile(project / "tokens.bin")
    np.arange(10, dtype=np.uint16).tofile(project / "short.bin")
    (project / "odd.bin").write_bytes(b"\0" * 1001)
    (project / "empty.bin").write_bytes(b"")
    (project / "broken.json").write_text('{"model_type": "llama",')
    (project / "plain.json").write_text(json.dumps({"hidden_size": 8}))
    (project / "runs").mkdir()
    (project / "runs" / "keep.txt").write_text("a user's file\n")
    _fake_run(project / "runs" / "done", _saved_config(), 200)
    _fake_run(project / "runs" / "damaged", "model:\n  name: [tiny\n", 5)
    (project / "runs" / "confdir" / "config.yaml").mkdir(parents=True)
    (project / "conf" / "model" / "broken.yaml").write_text("name: broken\n_target_: model.ConvLM\nargs: {dim: [64}\n")
    write_prepared(project / "prepared_big", [list(range(300))], vocab=300, tokenizer="big")
    write_prepared(project / "prepared_bytes", [list(range(257))])
    # A checkpoint copied into a run directory of its own (no config.yaml), trained on other data.
    (project / "runs" / "copied" / "checkpoints" / "step_5").mkdir(parents=True)
    other = {"data.path": {"fingerprint": "sha256:" + "0" * 64, "weight": 1.0}}
    (project / "runs" / "copied" / "checkpoints" / "step_5" / "COMPLETE").write_text(
        json.dumps({"step": 5, "world_size": 1, "data": other}))


def _submitted_from(base: Path, since: str) -> list[str]:
    """Jobs SLURM accepted since `since` from a directory under `base` (none without a SLURM cluster here)."""
    if shutil.which("sacct") is None:
        return []
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-S", since, "-o", "JobID,WorkDir%1000"], capture_output=True,
                         text=True).stdout
    return [line for line in out.splitlines() if str(base) in line]


@dataclass
class Outcome:
    returncode: int
    stderr: str
    changed: list[str]


# Run in a real interpreter as well: our refusal, Hydra's own error (held back, then one line), a sweep (our
# sweeper plugin), a user's model (the probe's child process, --config-dir), a credential (the environment), a
# relative path (the working directory), a project's YAML.
REAL_PROCESS = ("lr-negative", "grammar", "sweep-point", "target-args", "online-bad-key", "tokens-missing",
                "project-yaml-syntax", "cfg-choice")


def _run(case: Case, base: Path, real_process: bool = False) -> Outcome:
    folder = base / (case.id + ("-real" if real_process else ""))
    project = copy_example(folder)
    _make_files(project)
    home = folder / "home"  # no ~/.netrc: credentials come only from what the case sets
    home.mkdir()
    before = _snapshot(project)
    args = list(case.args)
    if not any(a.startswith("run.root") for a in args):
        args.append(f"run.root={hq(project / 'runs')}")
    env = launcher_env(HOME=str(home), **case.env)
    env.pop("WANDB_MODE", None)  # the credential cases log online; nothing else gets that far
    if real_process:
        out = subprocess.run([sys.executable, "-m", "launcher", *args], cwd=project, env=env, capture_output=True,
                             text=True, timeout=case.timeout)
    else:
        out = run_module("launcher", args, cwd=project, env=env, timeout=case.timeout)
    after = _snapshot(project)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return Outcome(out.returncode, out.stderr, changed)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """case id -> its outcome (forked); "real:" + case id -> the same case in a real interpreter."""
    base = tmp_path_factory.mktemp("bad_inputs")
    _saved_config()  # composed once, before the threads (Hydra's global state is not thread-safe)
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    by_id = {c.id: c for c in CASES}
    runs = [(c.id, c, False) for c in CASES] + [("real:" + i, by_id[i], True) for i in REAL_PROCESS]
    # The slowest first (a user's model is asked in a child process that imports torch), so none is left alone
    # at the end.
    runs.sort(key=lambda r: not (r[2] or _probes(r[1])))
    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        results = dict(zip([r[0] for r in runs], pool.map(lambda r: _run(r[1], base, r[2]), runs), strict=True))
    assert _submitted_from(base, since) == [], "a bad input reached SLURM"
    return results


def _probes(case: Case) -> bool:
    return any(a.startswith(("model._target_", "data._target_")) for a in case.args) or BYO[0] in case.args


def test_the_suite_covers_every_kind_of_input() -> None:
    assert len({c.id for c in CASES}) == len(CASES) >= 30
    assert len({c.expect for c in CASES}) == len(CASES)
    assert set(REAL_PROCESS) <= {c.id for c in CASES}


@pytest.mark.parametrize("case_id", REAL_PROCESS)
def test_a_real_interpreter_gives_what_the_forked_one_gives(case_id: str, outcomes: dict[str, Outcome]) -> None:
    real, forked = outcomes["real:" + case_id], outcomes[case_id]
    real_stderr = real.stderr.replace(f"{case_id}-real", case_id)  # its own copy of the project
    assert (real.returncode, real_stderr, real.changed) == (forked.returncode, forked.stderr, forked.changed)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(case: Case, outcomes: dict[str, Outcome]) -> None:
    out = outcomes[case.id]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert case.expect in lines[0], lines[0]
    assert not case.absent or case.absent not in lines[0], lines[0]
    assert out.changed == [], out.changed
