"""The launch plan: what a validated config will do, and whether it can (pure arithmetic on the config, no torch).

    launch_plan.py   make_plan: the checks in order and the derived values; Plan, printed before a run and saved
                     as RUN_DIR/plan.json
    world.py         the world size, ranks per node, the GPUs on this machine
    run_name.py      the run name derived from the training settings, which a resume must keep
    parallel.py      tensor, pipeline, context and data-parallel degrees on the device mesh, laid onto the cluster
    moe_plan.py      a mixture of experts and parallel.ep: their refusals, the plan's total and active parameters
    estimate.py      memory per GPU and step time of a config (FLOPs per token: contract/rules/flops.py)
    fit.py           does it fit, which strategy (strategy=auto), the learning-rate scaling, the compute budget
    fit_advice.py    when nothing fits: fewer local ranks or shorter sequences, the change that does
    step_plan.py     the plan's lines on how a step runs: compile and gc, float8, the loss, the checkpoint check
    lr_schedule.py   the learning-rate schedule: refused when it can't run, described across a resume
    probe.py         asks a user's model and data (a child process) what the plan needs to know
    replica_plan.py  parallel.replica_groups: its refusals (one line each) and the plan's lines for the groups
    replica_slurm_plan.py  replica groups on SLURM: whole nodes per group, where the lighthouse runs, the array line
    init_from.py     which weights the run starts from (model.init_from, a random init, its own checkpoint)
    code_change.py   a resume from another +remote snapshot than its checkpoint's: the files changed, a refusal
                     when the checkpoint does not fit the model the new code builds
    data_plan.py     the plan's data lines: each source's epochs, supervised fine-tuning data, small validation sets
"""
