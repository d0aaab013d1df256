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


def check_histogram(f, tiers=("host", "nvme")):
    """Cumulative buckets, +Inf == _count; one series per tier the block comes from (@tiers),
    or a single unlabelled series when @tiers is None."""
    by_tier = {}
    for s in f.samples:
        by_tier.setdefault(s.labels.get("tier"), []).append(s)
    assert sorted(by_tier, key=str) == (sorted(tiers) if tiers else [None])
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
    assert sample(fams, "kvtier_park_duration_seconds_count") > 0


def sample(fams, name, **labels):
    """The value of the one sample called @name (with @labels) in any family."""
    got = [s.value for f in fams.values() for s in f.samples
           if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(got) == 1, (name, labels, got)
    return got[0]


def test_nvme_histograms_and_counters(tmp_path):
    """NVMe traffic lands in the right series: promotions read from NVMe under tier="nvme"
    (host-to-HBM copies under tier="host"), NVMe writes, parks and resumes in their own
    histograms; idle_parked, batches and repromotions exported; kvtier_build_info."""
    with kvtier.Engine(n_layers=2, n_kv_heads=2, head_dim=8, dtype="f32", tokens_per_block=4,
                       hbm_bytes=8 * 1024, host_bytes=4 * 1024, nvme_dir=str(tmp_path),
                       nvme_bytes=1 << 20) as eng:
        seq = eng.open_sequence()
        seq.append(range(12))
        eng.prepare([seq]).release()
        seq.park(kvtier.TIER_NVME)
        eng.drain()
        seq.resume()
        eng.prepare([seq]).release()
        eng.drain()
        st = eng.stats()
        fams = families(eng.metrics_text())
    check_conventions(fams)
    prom = fams["kvtier_promotion_duration_seconds"]
    check_histogram(prom)
    for name in ("kvtier_nvme_write_duration_seconds", "kvtier_park_duration_seconds",
                 "kvtier_resume_duration_seconds"):
        assert fams[name].type == "histogram", name
        check_histogram(fams[name], None)
    assert st["blocks_moved"]["nvme_to_host"] == 3 and st["blocks_moved"]["host_to_nvme"] >= 3
    assert sample(fams, "kvtier_promotion_duration_seconds_count", tier="nvme") == \
        st["blocks_moved"]["nvme_to_host"] == st["tier"][kvtier.TIER_HOST]["promote_count"]
    assert sample(fams, "kvtier_promotion_duration_seconds_count", tier="host") == \
        st["blocks_moved"]["host_to_hbm"] == st["tier"][kvtier.TIER_HBM]["promote_count"]
    assert sample(fams, "kvtier_nvme_write_duration_seconds_count") == \
        st["blocks_moved"]["host_to_nvme"] == st["nvme_write"]["count"]
    assert sample(fams, "kvtier_nvme_write_duration_seconds_bucket", le="+Inf") == \
        st["nvme_write"]["count"]
    assert sample(fams, "kvtier_park_duration_seconds_count") == st["park"]["count"] == 1
    assert sample(fams, "kvtier_resume_duration_seconds_count") == st["resume"]["count"] == 1
    assert sample(fams, "kvtier_park_duration_seconds_sum") > 0
    for name, key in (("kvtier_idle_parked", "idle_parked"), ("kvtier_batches", "batches"),
                      ("kvtier_repromotions", "repromotions")):
        assert fams[name].type == "counter", name
        assert sample(fams, name + "_total") == st[key], name
    assert st["batches"] == 2
    info = fams["kvtier_build_info"]
    assert info.type == "gauge" and len(info.samples) == 1
    assert info.samples[0].value == 1
    assert info.samples[0].labels == {"version": kvtier.version(),
                                      "cuda": info.samples[0].labels["cuda"]}
    assert info.samples[0].labels["cuda"] in ("yes", "no", "emulated")
