"""paper-h100 against the paper's numbers (seed 000, Sec. IV and VI, Figs. 8-11), with
DDP's real bucket plans from ccddp.workloads.

What is FITTED (so only a regression guard here): GraphSAGE 1.61x and GPT2-Large 16.78x on
2 GPUs (crypto fixed cost and byte rate), ResNet-50's 8.6% CPU share (CPU AES-GCM rate),
ResNet-50/101's +72.4% / +75.1% runtime from 2 to 4 GPUs (their compute times).
Everything else below is a prediction checked against a number or statement the model was
not fitted to. Tolerances, and why:

- Fig. 11 GPT2 ratios 2.9 (4 vs 2 GPUs) and 6.6 (8 vs 2): +-10%. The paper gives one
  decimal and its own numbers disagree at that level (16.78x -> 42.36x implies 2.52 unless
  the CC-off run also grows 15%). The model gives 2.95 / 6.85.
- Fig. 11 averages 2.2 and 4.8 over the seven workloads: +-10% (model 2.22 / 4.83).
- Orderings: exact (GraphSAGE least affected at 2, 4, 8 GPUs; the GPT2s the two most;
  GPT2-Large above GPT2-XL on 2 and 4 GPUs, as 16.78 / 42.36 vs 41.64).
- Overhead share (1 - CC-off/CC-on; the paper's "98.8%" for GPT2-XL on 8 GPUs is exactly
  1 - 1/81.8) rises with n for every workload; GPT2 above 93% on 2 GPUs; GPT2-XL on 8 GPUs
  within 1 percentage point of 98.8%.
- Absolute slowdowns on 4 GPUs within 25%, GPT2-XL on 8 GPUs within 40%: the model keeps
  GPT2's CC-off time flat with n (its input is 16 kB), while the paper's CC-off runs grow
  (Sec. VI-B: "on average 1.2x", attributed to PCIe), which lowers its slowdowns; the
  model is +14..21% on 4 GPUs and +34% for GPT2-XL on 8.
- "Average" slowdown 8x (4 GPUs) and 11.7x (8 GPUs) read as geometric means (an
  arithmetic mean of 8x is impossible with two of seven workloads at ~42x): within 25%
  (model 7.2x / 14.0x).
- Compute share of CC-on on 2 GPUs, "an average of 40% and 52% in BERT and ResNet":
  within 15 percentage points (model 52% / 43%).
Not reproduced, so not tested: GraphSAGE's own Fig. 11 ratios (2.3x / 6.2x, which the
paper attributes to data preprocessing growing super-linearly; the model gives 1.7x / 3.3x).
"""

from __future__ import annotations

import math
import statistics

import pytest

from ccddp.sim import Schedule, derive_workload, load_profile, predict

NAMES = ("graphsage", "resnet50", "resnet101", "bert-base", "bert-large", "gpt2-large",
         "gpt2-xl")
GPUS = (2, 4, 8)
NAIVE = Schedule("naive")


@pytest.fixture(scope="module")
def hw():
    return load_profile("paper-h100")


@pytest.fixture(scope="module")
def workloads(hw):
    from ccddp.workloads import bucket_plan

    return {n: derive_workload(n, bucket_plan(n, dtype="float32").bucket_bytes, hw)
            for n in NAMES}


@pytest.fixture(scope="module")
def rows(hw, workloads):
    return {(name, n): predict(hw, wl, NAIVE, n) for name, wl in workloads.items()
            for n in GPUS}


def slowdowns(rows, n):
    return {name: rows[name, n]["slowdown"] for name in NAMES}


def test_real_bucket_counts(workloads):
    counts = {n: w.num_buckets for n, w in workloads.items()}
    assert counts["graphsage"] == 2 and counts["bert-large"] == 38       # paper Fig. 6
    assert abs(counts["gpt2-xl"] - 142) <= 5                             # paper: 142


@pytest.mark.parametrize("n", GPUS)
def test_crypto_ops_per_allreduce_per_rank(rows, n):
    for name in NAMES:
        ops = rows[name, n]["ops"]
        assert ops["ops_per_allreduce"] == 4 * (n - 1)
        assert ops["crypto_ops"] == 4 * ops["allreduces"] * (n - 1)      # 4 k (n-1)


def test_fitted_anchors_hold(rows):
    assert rows["graphsage", 2]["slowdown"] == pytest.approx(1.61, rel=0.03)
    assert rows["gpt2-large", 2]["slowdown"] == pytest.approx(16.78, rel=0.03)


@pytest.mark.parametrize("name", ["gpt2-large", "gpt2-xl"])
def test_fig11_gpt2_ratios(rows, name):
    r4 = rows[name, 4]["cc_on_ms"] / rows[name, 2]["cc_on_ms"]
    r8 = rows[name, 8]["cc_on_ms"] / rows[name, 2]["cc_on_ms"]
    assert r4 == pytest.approx(2.9, rel=0.10) and r4 < 3
    assert r8 == pytest.approx(6.6, rel=0.10) and r8 < 7


def test_fig11_averages(rows):
    r4 = statistics.mean(rows[w, 4]["cc_on_ms"] / rows[w, 2]["cc_on_ms"] for w in NAMES)
    r8 = statistics.mean(rows[w, 8]["cc_on_ms"] / rows[w, 2]["cc_on_ms"] for w in NAMES)
    assert r4 == pytest.approx(2.2, rel=0.10)
    assert r8 == pytest.approx(4.8, rel=0.10)


@pytest.mark.parametrize("n", GPUS)
def test_workload_ordering(rows, n):
    sd = slowdowns(rows, n)
    ranked = sorted(sd, key=sd.get)
    assert ranked[0] == "graphsage"
    assert set(ranked[-2:]) == {"gpt2-large", "gpt2-xl"}
    if n in (2, 4):
        assert ranked[-1] == "gpt2-large"


def test_overhead_share_grows_with_gpus(rows):
    for name in NAMES:
        shares = [rows[name, n]["overhead_share"] for n in GPUS]
        assert shares == sorted(shares) and shares[0] < shares[-1]
    assert rows["gpt2-large", 2]["overhead_share"] > 0.93
    assert rows["gpt2-xl", 2]["overhead_share"] > 0.93
    assert abs(rows["gpt2-xl", 8]["overhead_share"] - 0.988) <= 0.01


def test_absolute_slowdowns(rows):
    for name, n, paper, tol in (("graphsage", 4, 1.85, 0.25), ("gpt2-large", 4, 42.36, 0.25),
                                ("gpt2-xl", 4, 41.64, 0.25), ("gpt2-xl", 8, 81.8, 0.40)):
        assert rows[name, n]["slowdown"] == pytest.approx(paper, rel=tol), (name, n)


def test_average_slowdowns_as_geometric_means(rows):
    for n, paper in ((4, 8.0), (8, 11.7)):
        geo = math.exp(statistics.mean(math.log(s) for s in slowdowns(rows, n).values()))
        assert geo == pytest.approx(paper, rel=0.25)


def test_compute_share_on_two_gpus(rows):
    def share(name):
        b = rows[name, 2]["breakdown"]
        return (b["forward"] + b["backward"]) / rows[name, 2]["cc_on_ms"]

    assert abs(statistics.mean(share(w) for w in ("bert-base", "bert-large")) - 0.40) <= 0.15
    assert abs(statistics.mean(share(w) for w in ("resnet50", "resnet101")) - 0.52) <= 0.15
    assert share("gpt2-xl") < 0.07                     # TEE over 93% of runtime


def test_fewer_allreduces_cost_less_with_cc(hw, workloads):
    """Sec. IV-B: with CC on, limit the number of all-reduces (raise bucket_cap_mb), "even
    if that means reduced opportunity to overlap": up to DDP's 25 MiB every step up pays;
    beyond it the lost overlap may eat the gain (ResNets: +0.3% / +1.2% at 100 MiB)."""
    for name, wl in workloads.items():
        t1, t5, t25, t100 = (predict(hw, wl, NAIVE.with_(bucket_cap_mb=c), 4)["cc_on_ms"]
                             for c in (1, 5, 25, 100))
        assert t1 > t5 >= t25, name
        assert t100 <= 1.02 * t25, name
