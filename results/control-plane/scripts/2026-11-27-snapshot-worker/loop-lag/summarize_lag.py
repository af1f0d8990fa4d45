# ruff: noqa: SIM115, B905, E741  (a measuring probe, kept as it ran)
import collections
import glob
import json
import sys

d, run = sys.argv[1], sys.argv[2]
go = json.load(open(run + "/go.json"))
t0 = go["start_unix_s"]
rows = [json.loads(l) for f in glob.glob(d + "/lag-*.jsonl") for l in open(f)]
by = collections.defaultdict(list)
for g in sorted(glob.glob(run + "/gen*/result.json")):
    r = json.load(open(g))
    for l, s in zip(r["latencies_s"]["Heartbeat"], r["starts_s"]["Heartbeat"]):
        by[int(s)].append(l)
secs = {r["sec"]: r for r in rows if "sec" in r}
stalls = collections.defaultdict(list)
for r in rows:
    if "stalled_ms" in r:
        stalls[int(r["t"] - t0)].append(r)
for sec in range(60):
    v = sorted(by.get(sec, []))
    s = secs.get(int(t0) + sec + 1) or secs.get(int(t0) + sec)
    ticks = s["ticks"] if s else None
    st = stalls.get(sec, [])
    hb = f"{v[len(v) // 2] * 1e3:5.0f}/{v[int(len(v) * 0.99)] * 1e3:5.0f}" if v else "-"
    print(
        f"{sec:2d} hb {hb:>12}  loop max late {ticks[1] * 1e3 if ticks else float('nan'):6.0f} ms ticks {ticks[0] if ticks else 0:3d}  proc {s['proc_cores'] if s else 0:.2f} box {s['box_busy'] if s else 0:.2f}  stalls {[round(x['stalled_ms']) for x in st]} {[x['loop'][-1] for x in st][:2]} {[x['others'] for x in st][:1]}"
    )
