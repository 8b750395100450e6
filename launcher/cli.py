"""The ``mxlbbsp`` command. ``main(argv)`` is callable from tests and returns the exit code.

Every error is one line on stderr, ``mxlbbsp <command>: error: <what, where, what to do>``:
exit 2 for bad input, 1 when the job could not run; no traceback.
"""
from __future__ import annotations

import logging
import sys
from typing import List, Optional

import click

from mxlbbsp import modes
from mxlbbsp.control.speed import TIME_MODELS
from mxlbbsp.core import signals as _signals
from mxlbbsp.core.env import VERSION as __version__

from .config import (
    HUB_CHOICES,
    HUB_FROM,
    RELAY_CHOICES,
    RELAY_FROM,
    ConfigError,
    LaunchConfig,
    parse_env,
    parse_ssh_options,
)
from .elastic import run_elastic
from .job import JobFailed, run_job

EXIT_USAGE = 2

LAUNCH_HELP = """Run COMMAND on N workers as one LB-BSP job.

\b
Starts, on this machine (or over SSH on the hosts of a hostfile, or with srun
on the nodes of the SLURM allocation it runs in):
  the ps-lite scheduler, S parameter servers (python -m mxlbbsp.server),
  the coordinator (in this process: predicts each worker's speed and splits
  the global batch so that all finish together), and N copies of COMMAND
  with DMLC_ROLE=worker. Every output line is prefixed with its role and rank.
The job ends when every worker has exited 0; the first failure, Ctrl-C or
SIGTERM stops every process of the job and names the cause.

The launcher's options end at COMMAND's first word, as in torchrun and
horovodrun: everything after it goes to COMMAND, with or without a -- before
it (`launch -n 2 python x.py --epochs 3` gives --epochs to x.py).

\b
Examples:
  mxlbbsp launch -n 4 python train.py --epochs 10
  mxlbbsp launch -n 3 --emulate-slowdown 1,1,3 --metrics m.jsonl -- python train.py
  mxlbbsp launch -H node1:4,node2:4 -- python train.py
  mxlbbsp launch -H hosts.txt -s 2 --sync bsp -- python train.py
"""


def _stall(value: Optional[str]) -> Optional[float]:
    """--stall-timeout: None (automatic), 0.0 (off, also 'off') or seconds."""
    if value is None:
        return None
    if value.strip().lower() == "off":
        return 0.0
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"--stall-timeout {value!r}: give seconds (e.g. 600), or 0 or off "
                          "to turn stall detection off") from None


class _LogLine(logging.Formatter):
    """The launcher's own prefix: ``[mxlbbsp] message``, ``[mxlbbsp] warning: message``."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        return f"[mxlbbsp] {text}"


class _Stderr(logging.Handler):
    """Writes to the sys.stderr of the moment (tests swap it), one line at a time."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            self.handleError(record)


def configure_logging(verbose: bool) -> None:
    """The only place that configures logging: the ``mxlbbsp`` loggers (the launcher, the
    coordinator, the balancing policies) write to stderr as the launcher's own lines;
    warnings always, with -v/--verbose also each split and decision. The root logger
    is left alone (no asyncio debug lines)."""
    logger = logging.getLogger("mxlbbsp")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(_LogLine())
        logger.addHandler(handler)
    if verbose:
        logger.setLevel(logging.DEBUG)
    elif logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


class _Group(click.Group):
    def format_epilog(self, ctx, formatter):
        formatter.write_paragraph()
        formatter.write_text("Run 'mxlbbsp COMMAND --help' for a command's options. "
                             "Docs: README.md and docs/ARCHITECTURE.md.")


def _default(field: str):
    """An option's default is its LaunchConfig field's: written once, there."""
    return LaunchConfig.__dataclass_fields__[field].default


#: click's parameter name of each sync mode's option -> its flag
_MODE_PARAMS = {"mode_" + flag.lstrip("-").replace("-", "_"): flag for flag in modes.all_options()}


def _mode_options(command):
    """The sync modes' own options, generated from their declarations (``SyncMode.options``):
    a new mode's options need no line here."""
    for param, flag in reversed(list(_MODE_PARAMS.items())):
        opt, names = modes.all_options()[flag]
        kind = click.Choice(opt.type) if isinstance(opt.type, tuple) else opt.type
        command = click.option(flag, param, type=kind, metavar=opt.metavar,
                               help=f"{', '.join(names)}: {opt.help}")(command)
    return command


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mxlbbsp")
@click.option("-v", "--verbose", is_flag=True,
              help="Log each split and the coordinator's decisions (as launch -v).")
def cli(verbose):
    """mxlbbsp: load-balanced synchronous training (LB-BSP) for Apache MXNet."""
    configure_logging(verbose)


@cli.command(help=LAUNCH_HELP, context_settings={"help_option_names": ["-h", "--help"],
                                                  "max_content_width": 100,
                                                  # like torchrun: the options end at the
                                                  # command's first word, -- or not
                                                  "allow_interspersed_args": False})
@click.option("-n", "-np", "--num-workers", type=int, metavar="N",
              help="Number of workers (default with -H or in a SLURM allocation: one per "
                   "slot). -np is horovodrun's spelling. Each worker gets MXLBBSP_RANK and, "
                   "as torchrun sets them, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE.")
@click.option("-s", "--num-servers", type=int, default=_default("num_servers"), show_default=True, metavar="N",
              help="Number of parameter servers.")
@click.option("-H", "--hostfile", metavar="HOSTS",
              help="Hosts to run on over SSH: a hostfile (an existing file; one host per "
                   "line: host, user@host, 'host slots=N', 'host port=P', host:P with P >= "
                   "1024) or an inline list as horovodrun's, host1:4,host2:4 (the number "
                   "after ':' is slots). Without it everything runs on this machine (in a "
                   "SLURM allocation: on its nodes, with srun).")
@click.option("--launcher", type=click.Choice(["local", "ssh", "slurm"]),
              help="How the processes start (default: ssh with -H, slurm inside a SLURM "
                   "allocation, else local).")
@click.option("--sync", type=click.Choice(modes.available()), default=_default("sync"),
              show_default=True,
              help="; ".join(f"{m}: {modes.get(m).help}" for m in modes.available()) + ".")
@_mode_options
@click.option("--predictor", default=_default("predictor"), show_default=True, metavar="NAME",
              help="Speed predictor of each worker's next iteration: narx (kernel units and "
                   "a least-squares output layer on past speeds and the --exog signals), ema, "
                   "last, ar (autoregressive), narx-adam (the first NARX). Compare them on a "
                   "trace with `mxlbbsp predict`.")
@click.option("--time-model", type=click.Choice(TIME_MODELS), default=_default("time_model"),
              show_default=True,
              help="linear: time = b / speed (b proportional to speed); affine: time = a + "
                   "b / speed with a fitted fixed cost a per worker; auto: once the fixed "
                   "cost is half the time or more (tiny models), keep the split equal unless "
                   "a worker is clearly (1.5x) slower at the equal batch, then linear "
                   "with one speed for the workers none clearly slower than another, "
                   "with the "
                   "equal split tried again every 24 iterations, and linear for good "
                   "once balancing shows the time growing with the batch; else linear.")
@click.option("--exog", default=_default("exog"), show_default=True, metavar="COLS",
              help="The predictor's exogenous inputs, from each worker's report: auto "
                   f"({','.join(_signals.DEFAULT)}), all, none, or a comma-separated list "
                   f"of {', '.join(_signals.COLUMNS)} (the *_tail ones: over the last quarter "
                   "of the compute phase; see mxlbbsp/core/signals.py).")
@click.option("--signals", "signal_spec", default=_default("signals"), show_default=True, metavar="COLS",
              help="What every worker reads of its host and reports (into --metrics, for "
                   "`mxlbbsp trace`), besides the --exog inputs: auto (all but the *_tail "
                   "ones, whose sampler thread costs a tiny model up to a fifth of its "
                   "speed), all, none, or a comma-separated list of columns as for --exog. "
                   "Use all to record traces with the tail.")
@click.option("--threshold", type=float, default=_default("threshold"), show_default=True,
              help="Semi-dynamic balancing: keep the current split unless the new one is "
                   "predicted to be this much faster.")
@click.option("--control-period", type=float, default=_default("control_period"),
              show_default=True, metavar="SECONDS",
              help="How often the workers report and, when an iteration is shorter than "
                   "this, the coordinator decides: the split then holds for the iterations "
                   "of one period, so that the control messages cost a model of a few "
                   "milliseconds per iteration almost nothing. 0: every iteration.")
@click.option("--max-batch-size", type=int, metavar="B",
              help="Most samples one worker may get per iteration (e.g. its memory).")
@click.option("--min-batch-size", type=int, metavar="B",
              help="Fewest samples one worker gets per iteration (default: 1, or for a model "
                   "with BatchNorm layers 8, at most half of global batch / N): a worker "
                   "starved of samples makes noisy updates and useless BatchNorm statistics.")
@click.option("--emulate-slowdown", metavar="SPEC",
              help="Stretch each worker's compute: '1,1,3' (one factor per worker) or a CSV "
                   "trace with columns iteration,rank,slowdown.")
@click.option("--emulate-compute", type=float, metavar="MS",
              help="Add MS milliseconds of emulated compute per sample (slept, no CPU): a "
                   "heavier model without the CPU contention, for experiments.")
@click.option("--metrics", metavar="PATH",
              help="Write one JSON record per worker per iteration here (JSON Lines).")
@click.option("--tensorboard", metavar="DIR",
              help="Also write TensorBoard event files here (tensorboardX): the values the "
                   "script gives mxlbbsp.log, and each worker's speed and batch size.")
@click.option("--env", "env_items", multiple=True, metavar="KEY=VALUE",
              help="Set a variable for every process (repeatable).")
@click.option("--log-dir", metavar="DIR",
              help="Also write each process's output to DIR/<role>.<rank>.log.")
@click.option("--progress", type=float, default=_default("progress"), show_default=True, metavar="SECONDS",
              help="Print a progress line this often (0: never).")
@click.option("--stall-timeout", metavar="SECONDS|off", callback=lambda c, p, v: _stall(v),
              help="Stop the job (exit 124) when no iteration finishes for this long, counted "
                   "from the start until the first one. Default: on, with a limit from the "
                   "job's own iteration times (20 x the recent median, at least 120 s; 300 s "
                   "until the first iteration). 0 or off: never.")
@click.option("--bind", metavar="ADDR",
              help="Address of this machine for the scheduler and coordinator (default: "
                   "127.0.0.1 without -H, else the one facing the first host).")
@click.option("--ps-interface", metavar="IFACE",
              help="Network interface ps-lite (scheduler, servers, workers) binds to, e.g. "
                   "a private network's; it must exist on every host. Default for --bind: "
                   "its address here. Default: ps-lite's own choice (see README, Security).")
@click.option("--ssh-port", type=int, metavar="PORT",
              help="SSH port (a hostfile's port wins).")
@click.option("--ssh-identity", metavar="PATH", help="SSH private key (ssh -i).")
@click.option("--ssh-option", "ssh_option_items", multiple=True, metavar="KEY=VALUE",
              help="Extra ssh -o option (repeatable).")
@click.option("--relay", type=click.Choice(list(RELAY_CHOICES)), default=_default("relay"),
              show_default=True,
              help="on: one relay process on every host with two or more workers: they "
                   "talk to it, and it sends the coordinator their reports and dones of an "
                   "iteration in one message, with its own forecasts of their speeds (the "
                   "coordinator's work per iteration stays small at hundreds of workers, "
                   "and the splits are the same; its workers reach it by a Unix socket in "
                   "/tmp); off: every worker talks to the coordinator itself (for workers in "
                   "containers that do not share the host's /tmp); auto: on in jobs of "
                   f"{RELAY_FROM} workers or more (below, the extra hop costs latency).")
@click.option("--hubs", type=click.Choice(list(HUB_CHOICES)), default=_default("hubs"),
              show_default=True,
              help="on: the relays reach the coordinator through hubs, processes on this "
                   "machine that each merge 8 hosts' relays' messages of an iteration into "
                   "one (the coordinator reads and writes n/64 connections, not n/8: at 1024 "
                   "workers less than half its CPU per iteration; the splits are the same; "
                   "each hub listens on a free TCP port of --bind); off: the relays talk to "
                   f"the coordinator themselves; auto: on from {HUB_FROM} relays.")
@click.option("--remote-python", metavar="PATH",
              help="Python on the remote hosts (default: this one's path, "
                   "i.e. the same virtualenv everywhere).")
@click.option("--checkpoint-dir", metavar="DIR",
              help="Write checkpoints here (params, optimizer state, loader position, the "
                   "coordinator's state), atomically, and resume from the newest one found "
                   "here when the job starts.")
@click.option("--checkpoint-every", type=int, metavar="N",
              help="Write a checkpoint after every N-th iteration (default 100 with "
                   "--checkpoint-dir).")
@click.option("--resume", metavar="DIR",
              help="Continue from the newest complete checkpoint in DIR (or the checkpoint "
                   "folder DIR), on any number of workers.")
@click.option("--restarts", type=int, default=_default("restarts"), show_default=True, metavar="N",
              help="When the job fails, restart it from the latest checkpoint up to N times "
                   "(over SSH without the hosts that fail the pre-flight); needs "
                   "--checkpoint-dir.")
@click.option("--host-discovery-script", metavar="PATH",
              help="Elastic job (as horovodrun's): an executable that prints the usable "
                   "hosts, one per line, host or host:slots, and exits 0. It runs every "
                   "--discovery-interval seconds; when the hosts change, the job is resized "
                   "at an iteration boundary (checkpointed there, then continued on the new "
                   "hosts from exactly that iteration: nothing trained is lost, and B stays "
                   "B). Needs --checkpoint-dir; not with -H or -n.")
@click.option("--min-workers", "--min-np", "min_workers", type=int, metavar="N",
              help="Elastic job: the fewest workers it runs on (default 1); below it the "
                   "job ends with one line naming the hosts that went. In a SLURM "
                   "allocation, --min-workers or --max-workers alone makes the job elastic "
                   "over the allocation's nodes.")
@click.option("--max-workers", "--max-np", "max_workers", type=int, metavar="N",
              help="Elastic job: the most workers it runs on (more slots are left unused).")
@click.option("--discovery-interval", type=float, default=_default("discovery_interval"),
              show_default=True, metavar="S",
              help="Elastic job: seconds between two runs of the discovery script.")
@click.option("--start-timeout", type=float, default=_default("start_timeout"),
              show_default=True, metavar="S",
              help="Elastic job: seconds to wait at the start for --min-workers worker "
                   "slots from the discovery script; then the job ends with exit 1.")
@click.option("--start-ahead/--no-start-ahead", default=_default("start_ahead"),
              show_default=True,
              help="Elastic job: on a change of hosts, start the next workers while the job "
                   "trains on, and move to them at an iteration boundary once they are "
                   "ready (the pause is then the hand-over only, not their start-up).")
@click.option("--dry-run", is_flag=True,
              help="Print the placement and the commands; start nothing.")
@click.option("-v", "--verbose", is_flag=True,
              help="Log each split (iteration, predicted speeds, the split) and the "
                   "coordinator's decisions (a split kept under --threshold, the time model).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def launch(num_workers, num_servers, hostfile, launcher, sync, predictor, time_model, exog,
           signal_spec, threshold, control_period,
           max_batch_size, min_batch_size, emulate_slowdown, emulate_compute, metrics,
           tensorboard, env_items, log_dir, progress,
           stall_timeout, bind, ps_interface, ssh_port, ssh_identity, ssh_option_items,
           relay, hubs, remote_python, checkpoint_dir, checkpoint_every, resume, restarts,
           host_discovery_script, min_workers, max_workers, discovery_interval, start_timeout,
           start_ahead, dry_run, verbose, command, **mode_values):

    configure_logging(verbose)

    config = LaunchConfig(
        command=list(command), num_workers=num_workers, num_servers=num_servers,
        hostfile=hostfile, launcher=launcher, sync=sync, predictor=predictor,
        time_model=time_model, exog=exog, signals=signal_spec, threshold=threshold,
        control_period=control_period, max_batch_size=max_batch_size, min_batch_size=min_batch_size, tensorboard=tensorboard,
        emulate_slowdown=emulate_slowdown,
        emulate_compute=emulate_compute,
        metrics=metrics, env=parse_env(env_items), log_dir=log_dir, progress=progress,
        stall_timeout=stall_timeout, bind=bind, ps_interface=ps_interface, ssh_port=ssh_port,
        ssh_identity=ssh_identity,
        ssh_options=parse_ssh_options(ssh_option_items), relay=relay, hubs=hubs,
        remote_python=remote_python,
        dry_run=dry_run, mode_options={_MODE_PARAMS[k]: v for k, v in mode_values.items()},
        checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, resume=resume,
        restarts=restarts, host_discovery_script=host_discovery_script,
        min_workers=min_workers, max_workers=max_workers,
        discovery_interval=discovery_interval, start_timeout=start_timeout,
        start_ahead=start_ahead)
    config.preflight()          # the machine's part, once: nothing has started yet
    if config.elastic:
        return run_elastic(config)
    return run_job(config)


# ---- predict and trace: registered below this line ----------------------------------------
from .cli_predict import predict as _predict  # noqa: E402
from .cli_predict import trace as _trace_cmd

cli.add_command(_predict)
cli.add_command(_trace_cmd)

# ---- report: registered below this line ----------------------------------------
from .cli_report import report  # noqa: E402

cli.add_command(report)

# ---- plan: registered below this line ----------------------------------------
from .cli_plan import plan as _plan  # noqa: E402

cli.add_command(_plan)


def _fail(command: Optional[str], message: str, code: int) -> int:
    where = f"mxlbbsp {command}" if command else "mxlbbsp"
    sys.stderr.write(f"{where}: error: {message}\n")
    sys.stderr.flush()
    return code


def main(argv: Optional[List[str]] = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""

    argv = list(sys.argv[1:] if argv is None else argv)
    name = next((a for a in argv if a in cli.commands), None)
    try:
        rv = cli.main(args=argv, prog_name="mxlbbsp", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        return _fail(name, "interrupted", 130)
    except click.UsageError as exc:
        hint = f" (see 'mxlbbsp {name} --help')" if name else " (see 'mxlbbsp --help')"
        return _fail(name, exc.format_message().replace("\n", " ") + hint, EXIT_USAGE)
    except click.ClickException as exc:
        return _fail(name, exc.format_message(), exc.exit_code)
    except ConfigError as exc:
        return _fail(name, str(exc), EXIT_USAGE)
    except JobFailed as exc:
        return _fail(name, str(exc), 1)
    except KeyboardInterrupt:
        return _fail(name, "interrupted", 130)
    return rv if isinstance(rv, int) else 0

