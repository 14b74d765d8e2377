"""Pure functions the launch and the ranks both compute, so both agree.

    schedules.py          learning-rate schedules in closed form of the step
    flops.py              training FLOPs per token (the plan's budget, telemetry's MFU)
    moe_shape.py          a mixture of experts' parameters: all of them (memory), the active ones (FLOPs)
    sbatch.py             a job's sbatch parameters from its config
    eval_jobs.py          evaluation jobs: which steps get one, their checks (the design)
    eval_job_script.py    an evaluation job's config and script (checked at launch, submitted by rank 0)
    eval_sets.py          eval.sets resolved and checked
    metric_order.py       which way a measured metric is better (keep_best, --best, a sweep's ranking)
    keep_best.py          checkpoint.keep_best: its launch checks, the Ranking retention reads
    harness.py            eval.harness.tasks checked at launch (known, on disk, offline), their result keys
    stability_checks.py   stability.* settings checked
    init_source.py        where model.init_from points, resolved without torch
    hf_config.py          model=hf_causal_lm: the local Hugging Face config, read as plain JSON
    hf_export.py          which runs export as a Hugging Face model (launcher.export --format hf, checkpoint.export_hf)
    strategy_names.py     the strategies a config can name and the compute-side class of each
    document_mask.py      data.document_mask: what it needs at launch, the plan's attention line
    per_block.py          which strategy settings work per model block (FSDP's units, checkpointing, compile)
    compile_modes.py      strategy.compile's unit (blocks or the whole model) and CUDA graphs: where each applies
    loss_chunks.py        when the loss runs in chunks of rows (large vocabularies), and what it holds
    float8.py             precision=fp8: the models, strategies and GPUs it takes, its FLOPs and peak for MFU
    grad_compression.py   strategy.grad_compression: what `auto` becomes, what each strategy refuses, the plan's line
    step_options.py       the step's compile, CUDA graphs and gc settings in one line (the plan, rank 0's log)
    verify_early.py       checkpoint.verify_early: when the early checkpoint check runs, the plan's line
"""
