# SPDX-License-Identifier: MIT
"""kvt_engine_metrics_text (and kvtier-run --metrics) parsed by prometheus_client's own parser:
valid 0.0.4 text, Prometheus naming (kvtier_ prefix, _total counters, base units), per-tier
and per-direction labels, cumulative histograms whose +Inf bucket equals _count."""
import math
import os
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

import kvtier


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def check_conventions(fams):
    assert len(fams) >= 30
    for name, f in fams.items():
        assert name.startswith("kvtier_"), name
        assert f.type in ("counter", "gauge", "histogram"), (name, f.type)
        assert f.documentation, name
        assert "_milli" not in name and "_ns" not in name and "_kib" not in name  # base units
        for s in f.samples:
            assert math.isfinite(s.value) and s.value >= 0, s
            if f.type == "counter":
                assert s.name == name + "_total", s.name  # the parser strips _total
            if "tier" in s.labels:
                assert s.labels["tier"] in ("hbm", "host", "nvme")
            if "direction" in s.labels:
                assert s.labels["direction"] in kvtier.MOVE_NAMES
        if "bytes" in name:
            assert name.endswith("_bytes"), name
        if "seconds" in name:
            assert name.endswith("_seconds"), name


def check_histogram(f):
    by_tier = {}
    for s in f.samples:
        by_tier.setdefault(s.labels["tier"], []).append(s)
    assert sorted(by_tier) == ["hbm", "host", "nvme"]
    for samples in by_tier.values():
        buckets = [s for s in samples if s.name.endswith("_bucket")]
        les = [float(s.labels["le"]) for s in buckets]
        assert les == sorted(les) and les[-1] == math.inf and len(les) == 11
        assert les[0] == 1e-05 and les[-2] == 0.5
        counts = [s.value for s in buckets]
        assert counts == sorted(counts)  # cumulative
        count = [s.value for s in samples if s.name.endswith("_count")][0]
        assert counts[-1] == count


def test_engine_metrics_parse(engine):
    seq = engine.open_sequence()
    seq.append(range(10))
    engine.prepare([seq]).release()
    seq.park(kvtier.TIER_HOST)
    engine.drain()
    engine.prepare([seq]).release()
    engine.drain()
    fams = families(engine.metrics_text())
    check_conventions(fams)
    assert fams["kvtier_promotion_duration_seconds"].type == "histogram"
    check_histogram(fams["kvtier_promotion_duration_seconds"])
    st = engine.stats()
    cap = {s.labels["tier"]: s.value for s in fams["kvtier_tier_capacity_bytes"].samples}
    assert cap == {"hbm": 8192, "host": 16384, "nvme": 0}
    assert fams["kvtier_tier_capacity_bytes"].type == "gauge"
    moved = {s.labels["direction"]: s.value for s in fams["kvtier_blocks_moved"].samples}
    assert moved["hbm_to_host"] == st["blocks_moved"]["hbm_to_host"] >= 3
    assert moved["host_to_hbm"] == st["blocks_moved"]["host_to_hbm"] >= 3
    for name in ("kvtier_tier_evictions", "kvtier_tier_hits", "kvtier_tier_misses",
                 "kvtier_stalls", "kvtier_stall_seconds", "kvtier_checksum_failures",
                 "kvtier_io_errors", "kvtier_prefix_hit_blocks", "kvtier_codec_raw_bytes",
                 "kvtier_moved_bytes"):
        assert fams[name].type == "counter", name
    assert fams["kvtier_prefetch_coverage_ratio"].type == "gauge"
    assert fams["kvtier_sequences_open"].samples[0].value == 1


def test_kvtier_run_metrics(root, tmp_path):
    run = os.environ.get("KVT_RUN") or os.path.join(root, "build", "kvtier-run")
    if not os.path.exists(run):
        pytest.skip("no kvtier-run")
    out = tmp_path / "m.txt"
    subprocess.run([run, "--steps", "40", "--tokens-per-block", "4", "--sessions", "2",
                    "--turns", "2", "--metrics", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    fams = families(out.read_text())
    check_conventions(fams)
    check_histogram(fams["kvtier_promotion_duration_seconds"])
    moved = {s.labels["direction"]: s.value for s in fams["kvtier_blocks_moved"].samples}
    assert moved["hbm_to_host"] > 0  # parked between turns
