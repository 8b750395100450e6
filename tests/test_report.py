"""`mxlbbsp report` renders PNG plots and an index.html that shows them, from metrics files.

The metrics files are written here (no cluster): records with the fields and the shape of
what the coordinator writes, for LB-BSP, BSP and ASP runs.
"""
import json
import random
import re
from pathlib import Path

import pytest

from conftest import run_mxlbbsp
from mxlbbsp.core import metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# matplotlib 3.8 calls pyparsing names that pyparsing 3.3 deprecates: not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:matplotlib.*")


def make_records(sync="lbbsp", workers=3, iterations=20, slowdown=None, B=None, seed=0,
                 wait_null=()):
    """Records of an emulated run: worker i is ``slowdown[i]`` times slower than 2000
    samples/s. lbbsp splits B by the (noisy) last speed, bsp and asp equally; bsp/lbbsp
    iterations end together, asp workers run on their own clocks for the same wall time, so
    fast workers log more iterations. ``wait_null``: (iteration, rank) pairs with wait_s null.
    """
    rng = random.Random(seed)
    B = B or max(64, 8 * workers)
    slowdown = list(slowdown or [1.0] * (workers - 1) + [3.0])
    base = [2000.0 / s for s in slowdown]
    records = []
    if sync == "asp":
        horizon = iterations * (B / workers) / min(base) * 1.2
        for rank in range(workers):
            clock, t = 0.0, 0
            while clock < horizon or t < 2:
                b = B // workers
                compute = b / (base[rank] * rng.uniform(0.9, 1.1)) + (0.3 if t == 0 else 0)
                wait = rng.uniform(0.001, 0.003)
                clock += compute + wait
                records.append(_record(t, rank, b, compute, wait, None, slowdown[rank], sync,
                                       1.7e9 + clock))
                t += 1
        records.sort(key=lambda r: (r["time"], r["rank"]))
    else:
        clock, predicted = 0.0, None
        for t in range(iterations):
            if sync == "lbbsp" and predicted is not None:
                # Proportional to speed, at least 1, largest remainders round up: sum is B.
                exact = [1 + (B - workers) * p / sum(predicted) for p in predicted]
                sizes = [int(x) for x in exact]
                by_rest = sorted(range(workers), key=lambda r: sizes[r] - exact[r])
                for r in by_rest[:B - sum(sizes)]:
                    sizes[r] += 1
            else:
                sizes = [B // workers + (1 if r < B % workers else 0) for r in range(workers)]
            speed = [v * rng.uniform(0.9, 1.1) for v in base]
            compute = [b / v + (0.3 if t == 0 else 0) for b, v in zip(sizes, speed)]
            iteration_s = max(compute) + 0.002
            for rank in range(workers):
                wait = iteration_s - compute[rank]
                records.append(_record(
                    t, rank, sizes[rank], compute[rank],
                    None if (t, rank) in wait_null else wait,
                    None if predicted is None else predicted[rank], slowdown[rank], sync,
                    1.7e9 + clock + compute[rank], iteration_s))
            clock += iteration_s
            if t > 0:                                   # the warm-up teaches nothing
                predicted = [b / c for b, c in zip(sizes, compute)]
    return records


def _record(t, rank, b, compute, wait, predicted, slowdown, sync, now, iteration_s=None):
    return {"iteration": t, "rank": rank, "host": "localhost", "batch_size": b,
            "compute_s": compute, "speed": b / compute, "cpu_percent": 50.0,
            "mem_percent": 3.9, "slowdown": slowdown, "sync": sync, "predictor": "ema",
            "time": now, "predicted_speed": predicted, "wait_s": wait,
            "sync_s": wait, "iteration_s": iteration_s if iteration_s is not None
            else compute + (wait or 0.0), "fallbacks": 0}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def pngs_of(index: Path):
    """The src of every <img> in index.html."""
    return re.findall(r'<img src="([^"]+)"', index.read_text())


def check_report(result, out: Path, n_images):
    """The CLI succeeded, printed index.html, and the page shows every PNG it made."""
    assert result.rc == 0, result.output
    assert "Traceback" not in result.output
    assert result.stdout.strip().splitlines()[-1] == str(out / "index.html")
    return check_pages(out, out / "index.html", n_images)


def check_pages(out: Path, index, n_images):
    index = Path(index)
    assert index == out / "index.html"
    srcs = pngs_of(index)
    assert len(srcs) == n_images
    on_disk = sorted(p.name for p in out.glob("*.png"))
    assert sorted(srcs) == on_disk                      # every PNG shown, nothing else
    for src in srcs:
        assert not src.startswith("/") and "://" not in src     # relative
        data = (out / src).read_bytes()
        assert data[:8] == PNG_MAGIC, src
        assert len(data) > 10_000, src                  # a drawn plot, not an empty canvas
    return index.read_text()


def test_report_of_one_run_shows_plots_and_summary(tmp_path):
    m = write_jsonl(tmp_path / "lbbsp.jsonl", make_records("lbbsp", workers=3, iterations=20))
    out = tmp_path / "report"
    r = run_mxlbbsp("report", m, "-o", out)
    page = check_report(r, out, n_images=3)             # batch, time, speed

    s = metrics.summarize(metrics.load(str(m)), skip=1)
    assert f"<td>{s['samples_per_s']:.1f}</td>" in page
    assert f"<td>{s['wait_share'] * 100:.1f} %</td>" in page
    assert f"<td>{s['mean_iteration_s'] * 1000:.2f} ms</td>" in page
    for rank, p in s["per_rank"].items():
        assert f"<td>worker {rank}</td>" in page
        assert f"<td>{p['mean_batch']:.1f}</td>" in page
        assert f"<td>{p['mean_compute_s'] * 1000:.2f}</td>" in page
        assert f"<td>{p['mean_wait_s'] * 1000:.2f}</td>" in page
        assert f"<td>{p['wait_share'] * 100:.1f} %</td>" in page
        assert f"<td>{p['mean_speed']:.1f}</td>" in page
    assert "LB-BSP" in page and "ema" in page and "lbbsp.jsonl" in page
    assert "3</b> workers" in page and "20 iterations" in page


def test_report_compares_runs(tmp_path):
    bsp = write_jsonl(tmp_path / "bsp.jsonl", make_records("bsp", seed=1))
    lb = write_jsonl(tmp_path / "lb.jsonl", make_records("lbbsp", seed=2))
    out = tmp_path / "cmp"
    r = run_mxlbbsp("report", bsp, lb, "-o", out)
    page = check_report(r, out, n_images=2 * 3 + 1)     # per run 3, and compare.png
    assert (out / "compare.png").exists()

    sums = [metrics.summarize(metrics.load(str(p))) for p in (bsp, lb)]
    assert "speedup vs BSP" in page
    for s in sums:
        assert f"<td>{s['samples_per_s']:.1f}</td>" in page
        assert f"<td>{s['mean_iteration_s'] * 1000:.2f}</td>" in page
        assert f"<td>{s['wait_share'] * 100:.1f} %</td>" in page
    speedup = sums[1]["samples_per_s"] / sums[0]["samples_per_s"]
    assert "<td>1.00x</td>" in page and f"<td>{speedup:.2f}x</td>" in page
    assert speedup > 1.2                  # the simulated 1:1:3 cluster: LB-BSP is faster


def test_runs_are_labelled_by_sync_mode_and_stem_when_ambiguous(tmp_path):
    from mxlbbsp.analysis.runs import _label_runs
    from mxlbbsp.analysis.runs import load_run
    (tmp_path / "a").mkdir()
    paths = [write_jsonl(tmp_path / "bsp.jsonl", make_records("bsp", iterations=3)),
             write_jsonl(tmp_path / "lb.jsonl", make_records("lbbsp", iterations=3)),
             write_jsonl(tmp_path / "lb2.jsonl", make_records("lbbsp", iterations=3)),
             write_jsonl(tmp_path / "a" / "lb2.jsonl", make_records("lbbsp", iterations=3))]
    runs = [load_run(str(p)) for p in paths]
    _label_runs(runs)
    assert [r.label for r in runs] == ["BSP", "LB-BSP (lb)", "LB-BSP (lb2) #3",
                                       "LB-BSP (lb2) #4"]


def test_report_of_64_workers(tmp_path):
    from mxlbbsp.analysis.report import write_report
    m = write_jsonl(tmp_path / "big.jsonl",
                    make_records("lbbsp", workers=64, iterations=12,
                                 slowdown=[1 + (i % 4) for i in range(64)]))
    out = tmp_path / "big"
    index = write_report([str(m)], str(out))
    page = check_pages(out, index, n_images=3)
    assert "64</b> workers" in page
    assert "median over workers" in page
    assert page.count("<td>worker ") == 64


def test_report_of_asp_run_with_unaligned_iterations(tmp_path):
    from mxlbbsp.analysis.report import write_report
    records = make_records("asp", workers=3, iterations=15)
    counts = {rank: len(rows) for rank, rows in metrics.by_rank(records).items()}
    assert counts[0] > counts[2]                         # really unaligned
    m = write_jsonl(tmp_path / "asp.jsonl", records)
    out = tmp_path / "asp"
    page = check_pages(out, write_report([str(m)], str(out)), n_images=3)
    assert "ASP" in page and "workers do not wait for each other" in page
    assert f"{min(counts.values())}-{max(counts.values())} iterations per worker" in page
    assert "no predicted speeds" in page


def test_report_with_null_waits_and_few_iterations(tmp_path):
    from mxlbbsp.analysis.report import write_report
    records = make_records("bsp", workers=2, iterations=3,
                           wait_null={(1, 0), (2, 0), (1, 1), (2, 1)})
    m = write_jsonl(tmp_path / "few.jsonl", records)
    page = check_pages(tmp_path / "few", write_report([str(m)], str(tmp_path / "few")), 3)
    assert "no wait time" in page
    assert "<td>n/a</td>" in page                        # no wait share for those workers

    one = write_jsonl(tmp_path / "one.jsonl", make_records("bsp", workers=2, iterations=1))
    index = write_report([str(one)], str(tmp_path / "one"))
    page = check_pages(tmp_path / "one", index, n_images=3)
    assert index == str(tmp_path / "one" / "index.html")
    assert "too few to leave out a warm-up" in page


def _bad(tmp_path):
    good = make_records("bsp", iterations=3)
    write_jsonl(tmp_path / "good.jsonl", good)
    (tmp_path / "garbage.jsonl").write_text(json.dumps(good[0]) + "\n{not json\n")
    rec = dict(good[0])
    del rec["compute_s"]
    write_jsonl(tmp_path / "missing.jsonl", good[:2] + [rec])
    rec = dict(good[0], batch_size="many")
    write_jsonl(tmp_path / "badtype.jsonl", good[:1] + [rec])
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "afile").write_text("x")


@pytest.mark.parametrize("args, needle", [
    (["nope.jsonl", "-o", "out"], "nope.jsonl"),
    (["garbage.jsonl", "-o", "out"], "garbage.jsonl:2: not a JSON object"),
    (["missing.jsonl", "-o", "out"], "missing.jsonl:3: missing field(s) compute_s"),
    (["badtype.jsonl", "-o", "out"], "badtype.jsonl:2: batch_size is 'many'"),
    (["empty.jsonl", "-o", "out"], "empty.jsonl: no records"),
    (["good.jsonl", "-o", "afile"], "is a file, not a directory"),
    (["good.jsonl"], "Missing option '-o'"),
])
def test_bad_input_one_line_exit_2(tmp_path, args, needle):
    _bad(tmp_path)
    r = run_mxlbbsp("report", *args, cwd=tmp_path)
    assert r.rc == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("mxlbbsp report: error: ")
    assert needle in lines[0]
    assert "Traceback" not in r.output
    assert not (tmp_path / "out").exists()               # nothing written on bad input
