#!/usr/bin/env python3
"""Checks the structure of a cross-target report folder (what the test run's two-model quick run
writes): report.json's fields, a figure or an error in every cell of every measured target, the
native pair measured on every model, the SVG charts well-formed and drawn, report.md and
index.html naming every chart.

    check_cross_target_report.py DIR [--expect-models a,b] [--expect-measured id,id]
"""
import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--expect-models", default="")
    ap.add_argument("--expect-measured", default="nxrt-cpu-1t,ort-cpu-1t")
    a = ap.parse_args()
    problems = []

    def need(cond, what):
        if not cond:
            problems.append(what)
        return cond

    with open(os.path.join(a.dir, "report.json")) as f:
        r = json.load(f)
    for k in ("date", "host", "method", "targets", "models", "summary"):
        need(k in r, f"report.json has no '{k}'")
    for k in ("cpu", "cores", "load_start", "load_end"):
        need(k in r.get("host", {}), f"host has no '{k}'")
    targets = {t["id"]: t for t in r.get("targets", [])}
    for t in targets.values():
        for k in ("id", "label", "status", "anchor"):
            need(k in t, f"target {t.get('id')} has no '{k}'")
        need(t["status"] == "measured" or t["status"].startswith("absent: "),
             f"target {t['id']}: status '{t['status']}' is neither measured nor absent with a reason")
        if t.get("anchor"):
            need(t["anchor"] in targets, f"target {t['id']}: anchor {t['anchor']} is not a target")
    names = [m.get("name") for m in r.get("models", [])]
    need(names, "no models")
    if a.expect_models:
        need(sorted(names) == sorted(a.expect_models.split(",")),
             f"models {names}, expected {a.expect_models}")
    measured = [t for t in targets.values() if t["status"] == "measured"]
    for m in r.get("models", []):
        for t in measured:
            cell = m.get("results", {}).get(t["id"])
            ok = cell is not None and (
                ("median_ms" in cell and cell["median_ms"] > 0 and cell["min_ms"] <= cell["median_ms"])
                or isinstance(cell.get("error"), str))
            need(ok, f"{m['name']}: target {t['id']}: neither a figure nor an error ({cell})")
        for k in ("nxrt", "ort"):
            cell = m.get("memory", {}).get(k, {})
            need(cell.get("peak_mib", 0) > 0 or isinstance(cell.get("error"), str),
                 f"{m['name']}: memory {k}: neither a figure nor an error")
    for tid in filter(None, a.expect_measured.split(",")):
        need(targets.get(tid, {}).get("status") == "measured", f"target {tid} was not measured")
        for m in r.get("models", []):
            need("median_ms" in m.get("results", {}).get(tid, {}),
                 f"{m['name']}: {tid} has no figure ({m.get('results', {}).get(tid)})")
    for s in r.get("summary", []):
        need(s["target"] in targets and s["anchor"] in targets, f"summary names unknown targets: {s}")

    charts = sorted(f for f in os.listdir(a.dir) if f.endswith(".svg"))
    need("latency.svg" in charts, "no latency.svg")
    need("ratio_nxrt-cpu-1t.svg" in charts, "no ratio_nxrt-cpu-1t.svg")
    for c in charts:
        try:
            root = ET.parse(os.path.join(a.dir, c)).getroot()
        except ET.ParseError as e:
            problems.append(f"{c}: not well-formed XML: {e}")
            continue
        need(root.tag in ("svg", SVG + "svg"), f"{c}: the root is {root.tag}, not svg")
        rects = [e for e in root.iter() if e.tag in ("rect", SVG + "rect")]
        texts = [e for e in root.iter() if e.tag in ("text", SVG + "text")]
        # the background and at least one bar per model
        need(len(rects) > len(names), f"{c}: {len(rects)} rects for {len(names)} models")
        need(any(n in "".join(t.itertext()) for t in texts for n in names),
             f"{c}: no model's name among its labels")
    md = open(os.path.join(a.dir, "report.md")).read()
    page = open(os.path.join(a.dir, "index.html")).read()
    need("## Targets" in md, "report.md has no Targets section")
    for c in charts:
        need(f"({c})" in md, f"report.md does not show {c}")
        need(f"src='{c}'" in page, f"index.html does not show {c}")
    for n in names:
        need(n in md and n in page, f"{n} is missing from report.md or index.html")
    if problems:
        print("cross-target report check FAILED:")
        for p in problems:
            print(f"  - {p}")
        sys.exit(1)
    print(f"cross-target report OK: {len(names)} models, {len(measured)} targets measured, "
          f"{len(targets) - len(measured)} absent with a reason, {len(charts)} charts")


if __name__ == "__main__":
    main()
