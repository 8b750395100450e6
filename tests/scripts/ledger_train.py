"""A Gluon training script for mxlbbsp jobs that records its sample ledger: which samples
each worker trained on at each iteration, read from the batches it was given (the data set's
items carry their index). tests/reference.py trains plain Gluon on those recorded global
batches and the test compares the parameters.

    ledger_train.py OUT_DIR [--model mlp|bn] [--samples N] [--batch-size B] [--epochs E]
                    [--loss sample|mean] [--step none|one|n] [--lr LR] [--momentum M]
                    [--lr-decay] [--seed-per-rank] [--shard-by-rank] [--loader-workers K]
                    [--hybridize] [--stop-after T] [--die-at T]

Writes OUT_DIR/init.params (rank 0, once: the parameters before training), appends
OUT_DIR/ledger-rank<r>.jsonl (one line per iteration: iteration, rank, workers, launch,
indices) and, at the end, OUT_DIR/rank<r>.params. ``--loss mean``: ``loss.mean()`` (a
habit mxlbbsp must make exact); ``--step one``: Gluon's ``trainer.step(1)``, ``--step n``:
``trainer.step(len(data))``; ``--seed-per-rank``: each worker shuffles with its own seed,
``--shard-by-rank``: each holds other samples (mistakes mxlbbsp refuses). ``--lr-decay``: a
learning-rate schedule (ledger_models.lr_schedule), whose position a checkpoint must carry.
``--stop-after T``: every worker leaves its loop after iteration T, so the job ends normally
there (with --checkpoint-dir, its final checkpoint is of iteration T: a later launch resumes
from it). ``--die-at T``: rank 1 exits with code 9 after iteration T, once (a marker file in
OUT_DIR), for --restarts.
"""
import argparse
import os
import sys

from mxnet import autograd, gluon, nd

import mxlbbsp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ledger_models  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--model", default="mlp", choices=ledger_models.MODELS)
p.add_argument("--samples", type=int, default=300)
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--loss", default="sample", choices=["sample", "mean"])
p.add_argument("--step", default="none", choices=["none", "one", "n"])
p.add_argument("--lr", type=float, default=0.1)
p.add_argument("--momentum", type=float, default=0.9)
p.add_argument("--seed-per-rank", action="store_true")
p.add_argument("--shard-by-rank", action="store_true")
p.add_argument("--loader-workers", type=int, default=0)
p.add_argument("--lr-decay", action="store_true")
p.add_argument("--hybridize", action="store_true")
p.add_argument("--stop-after", type=int, default=-1)
p.add_argument("--die-at", type=int, default=-1)
args = p.parse_args()

rank = mxlbbsp.rank()
net = ledger_models.model(args.model)
init = os.path.join(args.out, "init.params")
if rank == 0 and not os.path.exists(init):
    net.save_parameters(init)
data = ledger_models.dataset(args.samples, seed=1234 + (rank if args.shard_by_rank else 0))
loader = mxlbbsp.DataLoader(data, global_batch_size=args.batch_size, shuffle=True,
                            seed=rank if args.seed_per_rank else 0,
                            num_workers=args.loader_workers)
if args.hybridize:
    net.hybridize()
opt = {"learning_rate": args.lr, "momentum": args.momentum}
if args.lr_decay:
    opt["lr_scheduler"] = ledger_models.lr_schedule()
trainer = mxlbbsp.Trainer(net.collect_params(), "sgd", opt)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
ledger = ledger_models.Ledger(args.out, rank, mxlbbsp.num_workers())
died = os.path.join(args.out, "died")
t = loader.resumed_iteration
for epoch in range(args.epochs):
    if t > args.stop_after >= 0:
        break
    for x, y, index in loader:
        with autograd.record():
            loss = loss_fn(net(x), y)
            if args.loss == "mean":
                loss = loss.mean()
        loss.backward()
        # before the step: a worker may end inside it (an elastic job's hand-over halts
        # there) after its iteration counted; a line of an iteration never finished is
        # written again by the launch that trains it (the later launch's lines win)
        ledger.write(t, index)
        if args.step == "one":
            trainer.step(1)
        elif args.step == "n":
            trainer.step(x.shape[0])
        else:
            trainer.step()
        if t == args.die_at and rank == 1 and not os.path.exists(died):
            nd.waitall()      # the iteration has ended (step() only issues the pushpull)
            open(died, "w").close()
            os._exit(9)
        t += 1
        if t > args.stop_after >= 0:
            break
net.save_parameters(os.path.join(args.out, f"rank{rank}.params"))
print(f"finished at iteration {t}")
