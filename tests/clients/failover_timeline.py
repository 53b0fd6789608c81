#!/usr/bin/env python3
"""The timeline of a planned failover in tests/clients_sentinel.rs, from the files the test
writes with CLIENTS_SENTINEL_DUMP=<dir> (and its output in <dir>.out), in ms after the leader
Sentinel's +selected-slave: when polestar read it, signalled the fence, the replica turned
master (MASTER MODE enabled), the fence was applied, and when the lost writes were acked.

usage: failover_timeline.py DIR...   (run the test with POLESTAR_LOG=
    'info,polestar::sentinel::link=debug,polestar::drain=debug' and --no-capture > DIR.out)
"""
import sys, re, datetime, glob, os
def lab_ts(line):
    m = re.search(r'(\d\d \w\w\w \d{4} \d\d:\d\d:\d\d\.\d{3})', line)
    return datetime.datetime.strptime(m.group(1), '%d %b %Y %H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp()*1000
def ps_ts(line):
    m = re.match(r'(\S+Z)', line)
    return datetime.datetime.strptime(m.group(1)[:26], '%Y-%m-%dT%H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp()*1000
for d in sys.argv[1:]:
    try:
        lab = open(d+'/lab.log').read().splitlines()
        ps = open(d+'/polestar.log').read().splitlines()
        out = open(d+'.out').read()
    except Exception as e:
        print(d, 'missing', e); continue
    sel = [lab_ts(l) for l in lab if '+selected-slave' in l]
    tryf = [lab_ts(l) for l in lab if '+try-failover' in l]
    mm = [lab_ts(l) for l in lab if 'MASTER MODE enabled' in l]
    rsel = [ps_ts(l) for l in ps if 'channel=+selected-slave' in l]
    prom = [ps_ts(l) for l in ps if 'signal=Promoting' in l]
    fen = [(ps_ts(l), l) for l in ps if 'fenced: writes paused' in l]
    if not (sel and mm and rsel and prom and fen):
        print(d, 'incomplete'); continue
    s0 = sel[0]
    lost = re.findall(r'(\d+) of (\d+) acknowledged writes lost', out)
    lostn = sum(int(a) for a,b in lost)
    lost_ms = [int(x) for x in re.findall(r'\(\d+, (\d+), \d+\)', out)]
    rt = re.search(r'round_trips=(\d+)', fen[0][1])
    backs = re.findall(r'(\S+ \S+ \S+ \S+) via polestar: back (\S+) ms', out)
    nr = [b for n,b in backs if 'node-redis' in n]
    lost_rel = sorted(int(x - s0) for x in lost_ms)
    print(f"{os.path.basename(d):22} try->sel {s0-tryf[0]:5.0f}  sel->recv {rsel[0]-s0:4.0f}  ->signal {prom[0]-s0:4.0f}  ->MASTERMODE {mm[-1]-s0:4.0f}  ->fenced {fen[0][0]-s0:4.0f}  rt={rt.group(1) if rt else '-'}  lost {lostn} at {lost_rel}  node-redis back {nr}")
