"""A seeded matrix of real jobs, each held to the independent reference.

Every job runs tests/scripts/ledger_train.py under ``mxlbbsp launch`` (a real scheduler,
servers and workers on loopback), which records its sample ledger: the indices each worker
trained on at each iteration. tests/reference.py (plain Gluon, no mxlbbsp, a process of its
own) checks that ledger (every iteration's ranks complete, each epoch a permutation of the
data set) and trains one process on the recorded global batches with the job's learning-rate
factors; the job must end with the same parameters on every worker, and with the
reference's within 1e-4 (BatchNorm's running statistics included), having trained every
epoch whole.

The draw. ``MXLBBSP_MATRIX_SEED`` (default :data:`SEED`; every test id starts with it) seeds
one RNG that draws :data:`JOBS` jobs from: BatchNorm or not; N mod B zero, small (a short
last batch: for BatchNorm under n x 8, BatchNorm's least local batch) or large; n in
{2, 3, 4}; sync in {lbbsp, bsp, goodput, courier}; uninterrupted, or stopped at a drawn
iteration (``--stop-after``: the job ends normally, with a final checkpoint) and resumed
onto n-1 or n+1 workers (lbbsp and bsp: the modes that checkpoint). Each value of each
factor is in every draw (a balanced design: the values are dealt out, then shuffled), and so
is every pair of lbbsp or bsp and a resume, with two goodput and two courier jobs at least. Sizes
(B, N, epochs, the iteration of the stop), the workers' slowdowns and emulated compute are
drawn too. One more job always: 8 workers, uneven (emulated compute and slowdowns), with a
short last batch. The launch options that no other test runs in a real job ride along in
:data:`BUNDLES`, each on one job of the draw at least, and each is checked for its effect.
A failure prints the configuration and the commands that reproduce it. With
``MXLBBSP_MATRIX_TABLE=FILE`` every passing job adds a JSON line to FILE: its id, its
largest difference from the reference and its time.

Launch options and a test whose real job runs each (``tests/<file>::<test>``; ``[...+x...]``:
the matrix job that carries bundle x; a default value runs in every job that does not set
the option):

    -n/-np/--num-workers, --metrics, --progress,     every job; -np: test_conventions::
      --env                                            test_options_after_the_command_are_...
    -s/--num-servers 2, --launcher local, --bind,    test_matrix::test_job[...+servers...]
      --relay off
    --relay on, --hubs on                            test_matrix::test_job[...+relay...],
                                                       test_cluster::test_lbbsp_ends_with_...
    -H/--hostfile, --ssh-port, --ssh-identity,       test_ssh::test_two_hosts_train_to_the_end
      --ssh-option
    --launcher ssh, --remote-python                  test_ssh::test_remote_python_is_what_...
    --launcher slurm (the default in an allocation)  test_slurm.py
    --sync lbbsp|bsp|goodput|courier                 test_matrix::test_job[...]
    --sync asp, r2sp                                 test_modes_cluster::test_async_modes_...
    --r2sp-gap-ratio, --r2sp-tuning                  test_matrix::test_r2sp_options_...
    --deadline, --epochs, --batch-range              test_matrix::test_job[...courier...]
    --lr-scaling linear|adascale (explicit)          test_matrix::test_job[...courier/goodput]
    --lr-scaling sqrt, none                          test_matrix::test_job[...+sqrt/+lr-none]
    --goodput-model homo                             test_matrix::test_job[...+homo...]
    --predictor ar, --threshold, --max-batch-size    test_matrix::test_job[...+ar...]
    --predictor narx-adam, --time-model affine       test_matrix::test_job[...+narx-adam...]
    --predictor ema, --time-model linear, -v         test_matrix::test_job[...+ema...]
    --predictor last, --exog none, --signals none    test_matrix::test_job[...+last...]
    --exog all, --signals all                        test_matrix::test_job[...+signals...]
    --exog COLS, --signals COLS                      test_signals::test_workers_report_...
    --control-period (its default: every job)        test_leases::test_sessions_hold_...;
      --control-period 0                               test_matrix::test_job[...+per-iteration...]
    --min-batch-size                                 test_matrix::test_job[...+min-batch...],
                                                       test_diagnoses::test_a_starved_worker_...
    --emulate-slowdown N,N,.., --emulate-compute     every job of the matrix
    --emulate-slowdown TRACE.csv                     test_courier::test_courier_job_uses_...
    --tensorboard                                    test_diagnoses::test_logged_curves_...
    --log-dir, --stall-timeout                       test_matrix::test_job[...+logs...]
    --ps-interface                                   test_ps_interface::test_ps_lite_listens_...
    --checkpoint-dir, --checkpoint-every, --resume   test_matrix::test_job[...-onto...]
    --restarts                                       test_checkpoint::test_a_dead_worker_...
    --dry-run                                        test_hostfile::test_dry_run_prints_...
                                                       (starts nothing, by its definition)
    --host-discovery-script, --discovery-interval,   test_elastic::test_grow_shrink_and_a_...,
      --min-workers, --start-ahead (the default)       test_sigterm_is_a_graceful_shrink_...
    --max-workers, --max-np (horovodrun's name)      test_elastic::test_grow_shrink_and_a_...
                                                       (--max-np), test_elastic::test_contra...
    --min-np (horovodrun's name of --min-workers)    test_slurm::test_an_elastic_job_...,
                                                       test_elastic::test_contradictory_...
    --no-start-ahead                                 test_elastic::test_sigterm_is_a_graceful_...
    --start-timeout                                  test_elastic::test_too_few_slots_until_...
                                                       (the start never reaches --min-workers)
"""
import json
import math
import os
import shlex
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import mxnet as mx
import numpy as np
import pytest

from conftest import PY, ROOT, run_mxlbbsp
from reference import against, command, difference

pytestmark = pytest.mark.cluster

SCRIPT = ROOT / "tests" / "scripts" / "ledger_train.py"
SEED = int(os.environ.get("MXLBBSP_MATRIX_SEED", "7"))
JOBS = 12
TOLERANCE = 1e-4
#: a file each passing job adds a line to: its id, its largest difference from the
#: reference and its seconds (the matrix's table, e.g. for a note); unset: none written
TABLE = "MXLBBSP_MATRIX_TABLE"
LR, MOMENTUM = 0.1, 0.9


# ---- the option bundles ----------------------------------------------------------------

@dataclass(frozen=True)
class Bundle:
    """Launch options (and script options) that ride on a job of the draw.

    ``options(job, folder)``: the launch options; ``fits(job)``: whether the job can carry
    them; ``check(job, folder, stderr, records)``: what they must have done."""

    name: str
    options: Callable
    fits: Callable
    check: Callable = lambda job, folder, stderr, records: None
    script: Tuple[str, ...] = ()

    def option_names(self, job, folder) -> set:
        return {o for o in map(str, self.options(job, folder)) if o.startswith("-")}


def _predictor_is(name):
    def check(job, folder, stderr, records):
        assert {r["predictor"] for r in records} == {name}
    return check


def _cap(job) -> int:
    """A per-worker cap that binds (under the fast workers' share) and still lets every
    launch split B."""
    fewest = min(job.workers)
    return max(math.ceil(job.batch / fewest) + 1, job.batch // 2)


def _capped(job, folder, stderr, records):
    assert {r["predictor"] for r in records} == {"ar"}
    assert max(r["batch_size"] for r in records) <= _cap(job)


def _verbose(job, folder, stderr, records):
    assert {r["predictor"] for r in records} == {"ema"}
    assert "[mxlbbsp] iteration 1: split " in stderr


def _nothing_read(job, folder, stderr, records):
    from mxlbbsp.core import signals
    assert {r["predictor"] for r in records} == {"last"}
    assert not [n for r in records for n in signals.NAMES if r.get(n) is not None]


def _everything_read(job, folder, stderr, records):
    from mxlbbsp.core import signals
    assert all(n in r for r in records for n in signals.NAMES)
    assert any(r["run_delay_tail"] is not None for r in records)


def _homo(job, folder, stderr, records):
    assert {r["goodput_model"] for r in records} == {"homo"}


def _two_servers(job, folder, stderr, records):
    assert " worker(s) and 2 server(s); " in stderr and "relay(s)" not in stderr   # relay off


def _logs(job, folder, stderr, records):
    logs = folder / "logs"
    for k in range(job.n):
        assert "finished at iteration" in (logs / f"worker.{k}.log").read_text(), k
    assert (logs / "server.0.log").exists()


def _relayed(job, folder, stderr, records):
    assert "relay(s) through 1 hub(s)" in stderr


BUNDLES = (
    Bundle("ar", lambda j, d: ["--predictor", "ar", "--threshold", 0.1,
                               "--max-batch-size", _cap(j)],
           lambda j: j.sync == "lbbsp", _capped),
    Bundle("narx-adam", lambda j, d: ["--predictor", "narx-adam", "--time-model", "affine"],
           lambda j: j.sync in ("lbbsp", "courier", "goodput"), _predictor_is("narx-adam")),
    Bundle("ema", lambda j, d: ["--predictor", "ema", "--time-model", "linear", "-v"],
           lambda j: j.sync in ("lbbsp", "courier", "goodput"), _verbose),
    Bundle("last", lambda j, d: ["--predictor", "last", "--exog", "none", "--signals", "none"],
           lambda j: True, _nothing_read),
    Bundle("signals", lambda j, d: ["--exog", "all", "--signals", "all"],
           lambda j: True, _everything_read),
    Bundle("homo", lambda j, d: ["--goodput-model", "homo", "--lr-scaling", "linear"],
           lambda j: j.sync == "goodput", _homo),
    Bundle("sqrt", lambda j, d: ["--lr-scaling", "sqrt"],
           lambda j: j.sync in ("courier", "goodput")),
    Bundle("lr-none", lambda j, d: ["--lr-scaling", "none"],
           lambda j: j.sync in ("courier", "goodput")),
    Bundle("servers", lambda j, d: ["-s", 2, "--launcher", "local", "--bind", "127.0.0.1",
                                    "--relay", "off"],
           lambda j: True, _two_servers),
    Bundle("logs", lambda j, d: ["--log-dir", d / "logs", "--stall-timeout", 300],
           lambda j: j.resume_onto is None, _logs),
    Bundle("relay", lambda j, d: ["--relay", "on", "--hubs", "on"], lambda j: True, _relayed),
    Bundle("min-batch", lambda j, d: ["--min-batch-size", 2], lambda j: j.model == "bn"),
    # a decision every iteration (the default decides once per control period)
    Bundle("per-iteration", lambda j, d: ["--control-period", 0],
           lambda j: j.sync in ("lbbsp", "bsp")),
    # batches loaded by 2 processes for a hybridized net: the reference is the check
    Bundle("prefetch", lambda j, d: [], lambda j: True, script=("--loader-workers", "2",
                                                                "--hybridize")),
)
BY_NAME = {b.name: b for b in BUNDLES}


# ---- a job of the matrix -----------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    """One configuration of the matrix; ``workers``: each launch's number of workers."""

    seed: int
    index: int
    model: str                       # mlp | bn
    rest: str                        # N mod B: zero | small | large
    workers: Tuple[int, ...]         # (n,) or (n, n') for a resume onto n'
    sync: str
    batch: int                       # B (courier, goodput: B0, the loader's)
    samples: int                     # N
    epochs: int
    stop_after: Optional[int]        # the first launch's last iteration (a resume)
    checkpoint_every: Optional[int]
    slowdowns: Tuple[str, ...]       # --emulate-slowdown of each launch
    compute: float                   # --emulate-compute, ms per sample
    mode_options: Tuple[str, ...]    # --batch-range, --deadline, --epochs
    bundles: Tuple[str, ...] = field(default=())

    @property
    def n(self) -> int:
        return self.workers[0]

    @property
    def resume_onto(self) -> Optional[int]:
        return self.workers[1] if len(self.workers) > 1 else None

    @property
    def lr_scaling(self) -> Optional[str]:
        """courier, goodput: the --lr-scaling rule (a bundle's, else the mode's default,
        given explicitly)."""
        for name in self.bundles:
            options = [str(o) for o in BY_NAME[name].options(self, _NOWHERE)]
            if "--lr-scaling" in options:
                return options[options.index("--lr-scaling") + 1]
        return {"courier": "linear", "goodput": "adascale"}.get(self.sync)

    @property
    def iterations(self) -> Optional[int]:
        """Iterations of the whole job (None when the coordinator chooses B(t))."""
        if self.sync in ("courier", "goodput"):
            return None
        return self.epochs * -(-self.samples // self.batch)

    @property
    def id(self) -> str:
        n = "n" + "-onto".join(map(str, self.workers))
        extras = "+" + "+".join(self.bundles) if self.bundles else ""
        return (f"s{self.seed}-{self.index:02d}-{self.model}-N{self.samples}B{self.batch}"
                f"{self.rest}-{n}-{self.sync}{extras}")

    def script_options(self) -> List[str]:
        out = ["--model", self.model, "--samples", self.samples, "--batch-size", self.batch,
               "--epochs", self.epochs, "--lr", LR, "--momentum", MOMENTUM]
        for name in self.bundles:
            out += BY_NAME[name].script
        return [str(x) for x in out]

    def launches(self, folder) -> List[List[str]]:
        """The arguments of each ``mxlbbsp`` command, in order."""
        common = ["--sync", self.sync, "--emulate-compute", self.compute, *self.mode_options,
                  "--metrics", folder / "m.jsonl", "--progress", 0]
        for name in self.bundles:
            common += BY_NAME[name].options(self, folder)
        if self.lr_scaling and "--lr-scaling" not in common:
            common += ["--lr-scaling", self.lr_scaling]
        script = ["--", PY, SCRIPT, folder / "job", *self.script_options()]
        if self.resume_onto is None:
            first = ["launch", "-n", self.n, "--emulate-slowdown", self.slowdowns[0], *common,
                     *script]
            return [[str(x) for x in first]]
        ckpt = folder / "ckpt"
        first = ["launch", "-n", self.n, "--emulate-slowdown", self.slowdowns[0], *common,
                 "--checkpoint-dir", ckpt, "--checkpoint-every", self.checkpoint_every,
                 *script, "--stop-after", self.stop_after]
        second = ["launch", "-n", self.resume_onto, "--emulate-slowdown", self.slowdowns[1],
                  *common, "--resume", ckpt, *script]
        return [[str(x) for x in first], [str(x) for x in second]]

    def reference(self, folder) -> dict:
        """tests/reference.py's options (:func:`reference.against`)."""
        return dict(model=self.model, samples=self.samples, lr=LR, momentum=MOMENTUM,
                    metrics=folder / "m.jsonl")

    def story(self, folder) -> str:
        """The configuration and the commands that reproduce it (from the checkout)."""
        lines = [f"matrix job {self.id}", f"  {self}", "reproduce (cd " + str(ROOT) + "):",
                 f"  rm -rf {folder} && mkdir -p {folder / 'job'}"]
        runs = self.launches(folder)
        for k, args in enumerate(runs):
            lines.append("  " + shlex.join([str(PY), "-m", "mxlbbsp.launcher", *args]))
            if k == 0 and len(runs) > 1:
                lines.append(f"  mkdir {folder / 'first'} && mv {folder / 'job'}/rank*.params "
                             f"{folder / 'first'}/")
        job = folder / "job"
        lines.append("  " + shlex.join(command(job, job / "ref.params",
                                               **self.reference(folder))))
        lines.append(f"or: MXLBBSP_MATRIX_SEED={self.seed} {PY} -m pytest -q "
                     f"tests/test_matrix.py -k '{self.id}'")
        lines.append(f"(the split follows measured speeds: this run's ledger and metrics are "
                     f"in {folder})")
        return "\n".join(lines)


# ---- the draw ----------------------------------------------------------------------------

def _dealt(rng, values, count):
    """``count`` values, each of ``values`` at least once if count allows, shuffled."""
    out = [values[k % len(values)] for k in range(count)]
    rng.shuffle(out)
    return out


def _rest(rng, rest, model, batch, most_workers) -> int:
    """N mod B for the category: 0; a short last batch (at least one sample per worker; for
    BatchNorm under n x 8, where the default least local batch cannot hold); or B/2 or more."""
    if rest == "zero":
        return 0
    if rest == "small":
        high = 8 * most_workers - 1 if model == "bn" else max(most_workers + 3, batch // 5)
        return int(rng.integers(most_workers, min(high, batch - 1) + 1))
    return int(rng.integers(batch // 2, batch))


def _slowdown(rng, n) -> str:
    """Per-worker factors, uneven: one worker at 1 and another at 3 at least."""
    if n == 1:
        return "1"
    factors = [int(x) for x in rng.choice([1, 1, 2, 3], size=n)]
    fast, slow = rng.choice(n, size=2, replace=False)
    factors[fast], factors[slow] = 1, 3
    return ",".join(map(str, factors))


def _mode_options(rng, sync, n, batch, model, epochs) -> Tuple[List[str], int]:
    """courier and goodput: their options, and the loader's B0, chosen so that B(t) must
    move: goodput's range lies below B0; courier's B0 is none of its candidates, and its
    deadline is either missed from the start (the fastest B at once) or far (the smallest B
    that meets it, after 5 plans agree)."""
    from mxlbbsp.core import planner
    low = 8 * n if model == "bn" else 2 * n
    if sync == "goodput":
        high = low + int(rng.integers(8, 24))
        return ["--batch-range", f"{low}:{high}"], high + int(rng.integers(6, 20))
    if sync == "courier":
        low = max(low, 16)
        high = 4 * low
        grid = set(planner.candidates(low, high).tolist())
        b0 = next(b for b in rng.permutation(np.arange(low + 1, high)) if int(b) not in grid)
        return ["--deadline", str(rng.choice(["2s", "90s"])), "--epochs", str(epochs),
                "--batch-range", f"{low}:{high}"], int(b0)
    return [], batch


def _job(rng, seed, index, model, rest, n, sync, resume, batches=(24, 64)) -> Job:
    workers = (n,) if resume is None else (n, n + resume)
    epochs = int(rng.choice([2, 3]))
    batch = int(rng.integers(batches[0], batches[1] + 1))
    mode_options, batch = _mode_options(rng, sync, n, batch, model, epochs)
    # courier: 10 iterations at least, for 5 plans to agree
    full = int(rng.integers(5, 8) if sync == "courier" else rng.integers(3, 7))
    samples = full * batch + _rest(rng, rest, model, batch, max(workers))
    total = epochs * -(-samples // batch)
    # the first launch plans 2 iterations at least after its 2 of warm-up
    stop_after = int(rng.integers(3, total - 2)) if resume is not None else None
    return Job(seed=seed, index=index, model=model, rest=rest, workers=workers, sync=sync,
               batch=batch, samples=samples, epochs=epochs, stop_after=stop_after,
               checkpoint_every=int(rng.integers(2, 6)) if resume is not None else None,
               slowdowns=tuple(_slowdown(rng, k) for k in workers),
               compute=float(rng.choice([0.5, 1.0])), mode_options=tuple(mode_options))


def draw(seed: int, count: int = JOBS) -> List[Job]:
    rng = np.random.default_rng(seed)
    pairs = [(s, r) for s in ("lbbsp", "bsp") for r in (None, -1, +1)]
    pairs += [("goodput", None), ("courier", None)] * 2
    pairs += [(str(rng.choice(["lbbsp", "bsp", "goodput", "courier"])), None)
              for _ in range(count - len(pairs))]
    rng.shuffle(pairs)
    models = _dealt(rng, ["mlp", "bn"], count)
    rests = _dealt(rng, ["zero", "small", "large"], count)
    ns = _dealt(rng, [2, 3, 4], count)
    jobs = [_job(rng, seed, k, models[k], rests[k], ns[k], *pairs[k]) for k in range(count)]
    # always: 8 uneven workers and a short last batch (of B, the loader's: lbbsp)
    jobs.append(_job(rng, seed, count, str(rng.choice(["mlp", "bn"])), "small", 8, "lbbsp",
                     None, batches=(48, 96)))
    return _deal_bundles(rng, jobs)


def _deal_bundles(rng, jobs: List[Job]) -> List[Job]:
    """Each bundle onto the job that fits it and carries the fewest so far (ties: drawn),
    never two bundles that set the same option."""
    carried = [[] for _ in jobs]
    for bundle in [BUNDLES[k] for k in rng.permutation(len(BUNDLES))]:
        fit = [k for k, job in enumerate(jobs) if bundle.fits(job) and not any(
            bundle.option_names(job, _NOWHERE) & BY_NAME[b].option_names(job, _NOWHERE)
            or bundle.script and BY_NAME[b].script for b in carried[k])]
        if not fit:
            continue
        least = min(len(carried[k]) for k in fit)
        k = int(rng.choice([k for k in fit if len(carried[k]) == least]))
        carried[k].append(bundle.name)
    return [replace(job, bundles=tuple(sorted(c))) for job, c in zip(jobs, carried)]


#: a folder for the bundles' options where only their names are read
_NOWHERE = Path("nowhere")
MATRIX = draw(SEED)


# ---- running a job -----------------------------------------------------------------------

def _splits(records):
    """iteration -> the workers' batch sizes in rank order (the last launch's records)."""
    by = {}
    for r in records:
        by.setdefault(r["iteration"], {})[r["rank"]] = r["batch_size"]
    return {t: [s[k] for k in sorted(s)] for t, s in sorted(by.items())}


def _moved(job, records) -> bool:
    """courier, goodput: some global batch that is not an epoch's last is not B0."""
    totals = [sum(s) for s in _splits(records).values()]
    ends, cursor = set(), 0
    for t, b in enumerate(totals):
        cursor += b
        if cursor % job.samples == 0:
            ends.add(t)
    return any(b != job.batch for t, b in enumerate(totals) if t not in ends)


def _adascale(record, b0):
    from mxlbbsp.core.lr import adascale
    return adascale(record["noise_scale"], record["global_batch"], b0)


#: --lr-scaling: the learning-rate factor of a metrics record at B(t), given B0
_LR_RULES = {"linear": lambda r, b0: r["global_batch"] / b0,
             "sqrt": lambda r, b0: math.sqrt(r["global_batch"] / b0),
             "none": lambda r, b0: 1.0, "adascale": _adascale}


@pytest.mark.parametrize("job", MATRIX, ids=[job.id for job in MATRIX])
def test_job(job, tmp_path):
    began = time.monotonic()
    folder = tmp_path
    (folder / "job").mkdir()
    story = job.story(folder)
    stderr = ""
    for k, args in enumerate(job.launches(folder)):
        r = run_mxlbbsp(*args, timeout=900)
        assert r.rc == 0, f"{story}\nlaunch {k + 1} exited {r.rc}:\n{r.output[-4000:]}"
        stderr += r.stderr
        if k == 0 and job.resume_onto is not None:
            assert f"finished at iteration {job.stop_after + 1}" in r.stdout, story
            (folder / "first").mkdir()
            for params in (folder / "job").glob("rank*.params"):
                shutil.move(str(params), folder / "first" / params.name)
    if job.resume_onto is not None:
        assert f"resuming from iteration {job.stop_after + 1}" in stderr, story
    params = sorted((folder / "job").glob("rank*.params"))
    assert len(params) == job.workers[-1], story
    ours = mx.nd.load(str(params[0]))
    for other in params[1:]:
        assert difference(mx.nd.load(str(other)), ours) == 0, f"{story}\n{other} differs"
    try:
        diff, epochs = against(folder / "job", **job.reference(folder))
    except AssertionError as exc:
        raise AssertionError(f"{story}\n{exc}") from None
    assert epochs == job.epochs, f"{story}\nthe reference trained {epochs} whole epoch(s)"
    assert diff <= TOLERANCE, f"{story}\nthe largest difference from the reference: {diff}"
    if os.environ.get(TABLE):
        with open(os.environ[TABLE], "a") as out:
            out.write(json.dumps({"job": job.id, "difference": diff,
                                  "seconds": round(time.monotonic() - began, 1)}) + "\n")

    records = [json.loads(line) for line in open(folder / "m.jsonl")]
    keys = [(r["iteration"], r["rank"]) for r in records]
    assert len(keys) == len(set(keys)), f"{story}\na record twice in the metrics"
    splits = _splits(records)
    if job.iterations is not None:
        assert sorted(splits) == list(range(job.iterations)), story
    if job.sync == "bsp":
        assert all(max(s) - min(s) <= 1 for s in splits.values()), f"{story}\n{splits}"
    else:
        # uneven workers: the split follows them somewhere (the warm-up's is equal)
        assert any(max(s) - min(s) > 1 for s in splits.values()), f"{story}\n{splits}"
    if job.sync in ("courier", "goodput"):
        assert _moved(job, records), f"{story}\nB(t) never moved from B0: {splits}"
        rule = _LR_RULES[job.lr_scaling]
        for r in records:
            assert r["lr_factor"] == pytest.approx(rule(r, job.batch)), f"{story}\n{r}"
    for name in job.bundles:
        try:
            BY_NAME[name].check(job, folder, stderr, records)
        except AssertionError as exc:
            raise AssertionError(f"{story}\nbundle {name}: {exc}") from None


def test_the_draw_covers_every_value_and_every_bundle():
    """Whatever the seed: each factor's values, every bundle, the 8-worker job."""
    for seed in (SEED, SEED + 1, SEED + 2):
        jobs = draw(seed)
        assert len(jobs) == JOBS + 1
        assert {j.model for j in jobs} == {"mlp", "bn"}
        assert {j.rest for j in jobs} == {"zero", "small", "large"}
        assert {j.n for j in jobs} >= {2, 3, 4}
        assert {j.sync for j in jobs} == {"lbbsp", "bsp", "goodput", "courier"}
        assert {(j.sync, (j.resume_onto or j.n) - j.n) for j in jobs} >= {
            (s, d) for s in ("lbbsp", "bsp") for d in (-1, 0, 1)}
        assert all(j.resume_onto is None or j.sync in ("lbbsp", "bsp") for j in jobs)
        assert {b for j in jobs for b in j.bundles} == set(BY_NAME), seed
        eight = [j for j in jobs if j.n == 8]
        assert len(eight) == 1 and 0 < eight[0].samples % eight[0].batch < 64
        for j in jobs:
            rest = j.samples % j.batch
            assert rest == 0 or rest >= max(j.workers), j        # every launch can split it
            if j.rest == "small" and j.model == "bn":
                assert rest < 8 * max(j.workers), j
        assert len({j.id for j in jobs}) == len(jobs)
    assert draw(SEED) == draw(SEED)


def test_r2sp_options_with_uneven_workers_use_every_sample_once_per_epoch(tmp_path):
    """--sync r2sp with --r2sp-gap-ratio and --r2sp-tuning balancer: its updates are
    asynchronous (no reference to equal), but its slices still tile each global batch: the
    ledger holds every iteration's ranks, and each epoch is a permutation."""
    from reference import check_epochs, read_ledger
    (tmp_path / "job").mkdir()
    r = run_mxlbbsp("launch", "-n", 3, "--sync", "r2sp", "--r2sp-gap-ratio", 0.5,
                    "--r2sp-tuning", "balancer", "--emulate-compute", 1,
                    "--emulate-slowdown", "1,1,3", "--metrics", tmp_path / "m.jsonl",
                    "--progress", 0, "--", PY, SCRIPT, tmp_path / "job", "--samples", 203,
                    "--batch-size", 30, "--momentum", 0, timeout=600)
    assert r.rc == 0, r.output
    batches = read_ledger(str(tmp_path / "job"))
    assert len(batches) == 2 * 7 and check_epochs(batches, 203) == 2
    assert any(max(map(len, b)) - min(map(len, b)) > 1 for b in batches), batches
