"""Trust domains: the hierarchical all-reduce, broadcast and reduce-scatter give gloo's
results for any map (uneven domains too), seal only what crosses domains (the counters
show the reduction), every other op stays correct, and ranks that disagree on the map
fail fast."""

from __future__ import annotations

import pytest
import torch

from dist_util import RankFailure, child_env
from dist_util import run_ranks as run_process_ranks
from thread_ranks import run_thread_ranks as run_ranks

SECRET = "4c7e19b2d8a05f36e1c94b7a2d6f803e5b1c9a7d2e4f6083b5a7c9e1d3f50b28"


def _inp(rank: int, numel: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g).to(dtype)
    return torch.randint(0, 1 << 20, (numel,), generator=g, dtype=dtype)


def _map_rank(rank, n, domains, numels):
    """One group over the map: every op against gloo (all-reduce, broadcast, all-gather
    and the rest), then reduce-scatter (equal and uneven chunks)."""
    import os
    from datetime import timedelta

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    from ccddp.backend import Options
    from ccddp.comm import CommSettings

    settings = CommSettings(segment_bytes=4096, timeout_s=30, trust_domains=domains)
    pg = dist.new_group(backend="ccddp", timeout=timedelta(seconds=30), pg_options=Options(settings=settings))
    return {**_every_op(pg, rank, n, numels), **_scatter_checks(pg, rank, n, numels)}


def _every_op(pg, rank, n, numels):
    import torch.distributed as dist

    R = dist.ReduceOp
    bad = []
    for numel in numels:
        for op, dtype in ((R.SUM, torch.float32), (R.AVG, torch.float64), (R.MAX, torch.float32),
                          (R.MIN, torch.int64), (R.PRODUCT, torch.float64), (R.BXOR, torch.int32)):
            x = _inp(rank, numel, dtype)
            if op == R.PRODUCT:
                x = 1 + x.abs() / 1000
            want = x.clone()
            dist.all_reduce(want, op=op)                       # gloo, the reference
            dist.all_reduce(x, op=op, group=pg)
            if not torch.allclose(x.double(), want.double(), rtol=1e-5, atol=1e-5):
                bad.append(f"{op} {dtype} {numel}: max diff {(x.double() - want.double()).abs().max()}")
    # Broadcast, hierarchical too: from every root, at every size.
    for numel in numels:
        for root in range(n):
            t = _inp(rank, numel) if rank == root else torch.zeros(numel)
            dist.broadcast(t, root, group=pg)
            if not torch.equal(t, _inp(root, numel)):
                bad.append(f"broadcast from {root}, {numel} elements")
    # All-gather (sealed end to end under any map): every rank's data in rank order.
    for numel in numels:
        out = torch.empty(n * numel)
        dist.all_gather_into_tensor(out, _inp(rank, numel), group=pg)
        if not torch.equal(out, torch.cat([_inp(r, numel) for r in range(n)])):
            bad.append(f"all_gather_into_tensor of {numel} elements")
    # Every other op, still correct under the map (sealed end to end).
    t = torch.full((5,), float(rank))
    dist.broadcast(t, 1, group=pg)
    outs = [torch.empty(3) for _ in range(n)]
    dist.all_gather(outs, torch.full((3,), float(rank)), group=pg)
    rs = torch.empty(2)
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * n), group=pg)
    dist.barrier(group=pg)
    if not (torch.equal(t, torch.full((5,), 1.0)) and all(torch.equal(o, torch.full((3,), float(r)))
                                                          for r, o in enumerate(outs))
            and torch.equal(rs, torch.arange(2.0 * n)[2 * rank:2 * rank + 2] * n)):
        bad.append("another op under the map")
    links = pg.domain_links
    sealed = pg.endpoint.counters.snapshot()
    cross = links.cross.counters.snapshot() if links is not None and links.cross is not None else None
    return {"bad": bad, "domains": [list(d) for d in pg.domains.domains],
            "cross_size": None if links is None or links.cross is None else links.cross.world_size,
            "sealed": sealed, "cross": cross}


MAPS = [
    (2, [[0, 1]]),                       # one domain: nothing sealed
    (3, [[0], [1, 2]]),                  # uneven: the single rank holds the only shard
    (4, [[0, 1], [2, 3]]),
    (4, [[0, 2], [1, 3]]),               # domains need not be contiguous
    (5, [[0, 1, 2], [3, 4]]),            # uneven: rank 2 holds no shard
    (6, [[0, 1, 2], [3, 4, 5]]),
    (6, [[0, 1], [2, 3], [4, 5]]),
]


@pytest.mark.parametrize("n,domains", MAPS, ids=[str(d) for _, d in MAPS])
def test_hierarchical_collectives_equal_gloo(n, domains):
    """Every op under the map gives gloo's results; equal-chunk reduce-scatters follow the
    map: nothing of them sealed on the flat links (only the uneven call, which stays flat,
    is)."""
    results = run_ranks(_map_rank, n, domains, [1, 7, 4099], timeout=400)
    for rank, res in enumerate(results):
        assert res["bad"] == [], (rank, res["bad"])
        assert res["scatter_bad"] == [], (rank, res["scatter_bad"])
        assert sorted(map(tuple, res["domains"])) == sorted(map(tuple, domains))
        mine = next(d for d in domains if rank in d)
        holds_shard = mine.index(rank) < min(len(d) for d in domains)
        assert res["cross_size"] == (len(domains) if len(domains) > 1 and holds_shard else None), rank
        # The uneven call seals at most its whole input, with descriptors: the equal
        # calls sealed nothing on the flat links.
        assert res["flat_sealed"] <= res["uneven"] + 256, (rank, res)


def _scatter_checks(pg, rank, n, chunks):
    import torch.distributed as dist

    R = dist.ReduceOp
    bad = []
    flat_before = pg.endpoint.counters.snapshot()["bytes_sealed"]
    for c in chunks:
        for op, dtype in ((R.SUM, torch.float32), (R.AVG, torch.float64), (R.MAX, torch.float32),
                          (R.MIN, torch.int64), (R.PRODUCT, torch.float64), (R.BXOR, torch.int32)):
            x = _inp(rank, n * c, dtype)
            if op == R.PRODUCT:
                x = 1 + x.abs() / 1000
            orig, want = x.clone(), torch.empty(c, dtype=dtype)
            dist.reduce_scatter_tensor(want, x, op=op)                  # gloo, the reference
            got = torch.full((c,), 7, dtype=dtype)
            dist.reduce_scatter_tensor(got, x, op=op, group=pg)
            if not torch.allclose(got.double(), want.double(), rtol=1e-5, atol=1e-5):
                bad.append(f"reduce_scatter_tensor {op} {dtype} {c}: "
                           f"max diff {(got.double() - want.double()).abs().max()}")
            if not torch.equal(x, orig):
                bad.append(f"reduce_scatter_tensor {op} {dtype} {c}: the input changed")
        # The list form with equal sizes, into a non-contiguous output, follows the map too.
        x = _inp(rank, n * c)
        want = torch.empty(c)
        dist.reduce_scatter_tensor(want, x)
        out = torch.zeros(c, 2)[:, 0]
        dist.reduce_scatter(out, list(x.split(c)), group=pg)
        if not torch.allclose(out, want, rtol=1e-5, atol=1e-5):
            bad.append(f"reduce_scatter (list) of {c}")
    # Uneven sizes stay on the flat sealed ring, still correct.
    sizes = [r + 1 for r in range(n)]
    out = torch.empty(rank + 1)
    dist.reduce_scatter(out, [torch.full((s,), float(rank)) for s in sizes], group=pg)
    if not torch.equal(out, torch.full((rank + 1,), float(sum(range(n))))):
        bad.append("reduce_scatter with uneven sizes")
    flat_sealed = pg.endpoint.counters.snapshot()["bytes_sealed"] - flat_before
    return {"scatter_bad": bad, "flat_sealed": flat_sealed, "uneven": sum(sizes) * 4}




def _bytes_rank(rank, n, domains, numel):
    import os
    from datetime import timedelta

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    from ccddp.backend import Options
    from ccddp.comm import CommSettings

    settings = CommSettings(timeout_s=30, trust_domains=domains)
    pg = dist.new_group(backend="ccddp", timeout=timedelta(seconds=30), pg_options=Options(settings=settings))
    sealed = {}
    for op, call in (("all_reduce", lambda: dist.all_reduce(torch.ones(numel), group=pg)),
                     ("broadcast", lambda: dist.broadcast(torch.ones(numel), 0, group=pg)),
                     ("reduce_scatter", lambda: dist.reduce_scatter_tensor(torch.empty(numel), torch.ones(n * numel),
                                                                           group=pg)),
                     ("all_gather", lambda: dist.all_gather_into_tensor(torch.empty(n * numel), torch.ones(numel),
                                                                        group=pg))):
        before = pg.crypto_counters()["bytes_sealed"]
        call()
        sealed[op] = pg.crypto_counters()["bytes_sealed"] - before
    return sealed


@pytest.mark.parametrize("domains", [[[0], [1], [2], [3]], [[0, 1], [2, 3]], [[0, 1, 2, 3]]])
def test_bytes_sealed_per_rank_drop_by_the_domain_size(domains):
    """Per rank and op, the bytes sealed drop as the schedules say."""
    n, numel = 4, 1 << 16
    size = numel * 4
    d, g = len(domains), len(domains[0])
    results = run_ranks(_bytes_rank, n, domains, numel, timeout=120)
    for sealed in results:
        # All-reduce: 2(d-1)/d * S/g data bytes (the flat schedule: d = n, g = 1), within a
        # chunk's rounding and the descriptors' bytes.
        assert abs(sealed["all_reduce"] - 2 * (d - 1) / d * size / g) <= 64, (domains, sealed)
        # Reduce-scatter: (d-1) chunks of S (the flat ring: n-1), on every rank here (equal
        # domains: every rank holds a shard).
        assert abs(sealed["reduce_scatter"] - (d - 1) * size) <= 64, (domains, sealed)
        # All-gather stays sealed end to end whatever the map: n-1 inputs.
        assert abs(sealed["all_gather"] - (n - 1) * size) <= 64, (domains, sealed)
    # Broadcast of S from rank 0: S/g at most, sealed once per shard (flat: S at every rank
    # of the chain but the last).
    assert max(r["broadcast"] for r in results) <= size / g + 64, (domains, results)
    assert sum(r["broadcast"] for r in results) >= (d - 1) * size, (domains, results)


def _disagree_rank(rank, n):
    import os
    from datetime import timedelta

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    from ccddp.backend import Options
    from ccddp.comm import CommSettings

    domains = [[0, 1], [2, 3]] if rank != 3 else [[0], [1], [2, 3]]
    settings = CommSettings(timeout_s=20, trust_domains=domains)
    dist.new_group(backend="ccddp", timeout=timedelta(seconds=20), pg_options=Options(settings=settings))
    return "created"


def test_a_rank_that_claims_another_map_fails_every_rank():
    results = run_ranks(_disagree_rank, 4, return_failures=True, timeout=120)
    for r in results:
        assert isinstance(r, RankFailure) and r.type_name == "ConfigError", r
        assert "trust domains" in r.message, r.message


@pytest.mark.parametrize("value", ["host", [[0, 1], [1, 2]], [[0], []], [["a"]], 3])
def test_a_bad_map_is_refused(value):
    from ccddp.comm import CommSettings
    from ccddp.comm.domains import DomainMap
    from ccddp.errors import ConfigError

    with pytest.raises(ConfigError, match="trust_domains"):
        DomainMap.of(CommSettings(trust_domains=value).trust_domains, 3)


def _gloo_reference_rank(rank, n, out):
    from domains_main import train

    train(out)


def test_two_nodes_train_with_plaintext_only_inside_each(tmp_path):
    """Two torchrun agents on this host (``--nnodes 2``, static rendezvous) with the
    ``node`` map: two domains of two ranks (the agents' node ranks split what the proof
    joins). DDP trains to gloo's parameters, and no byte of a rank's own data goes over
    TCP unsealed -- not even to its own domain's ranks -- while it does travel in
    plaintext on the domains' local (AF_UNIX) links (so the search would see a leak)."""
    import json
    import os
    import subprocess
    import sys

    from domains_main import markers
    from wire_util import HERE, build_wiretap, found

    lib = build_wiretap(tmp_path)
    ref, run, wire = tmp_path / "gloo", tmp_path / "ccddp", tmp_path / "wire"
    for d in (ref, run, wire):
        d.mkdir()
    script = str(HERE / "domains_main.py")
    # The reference: the same training on gloo, ranks forked (their own seeds and pids).
    run_process_ranks(_gloo_reference_rank, 4, str(ref), timeout=300)
    from ccddp.bench.launch import free_port

    port = free_port()
    env = child_env(dict(OMP_NUM_THREADS="1", CCDDP_GROUP_SECRET=SECRET,
                         CCDDP_SETTINGS='{"trust_domains": "node", "timeout_s": 60}',
                         LD_PRELOAD=str(lib), CCDDP_WIRE_DIR=str(wire), CCDDP_WIRE_BY_PEER="1"))
    agents = [subprocess.Popen([sys.executable, "-m", "ccddp.cli", "launch", "--nnodes", "2", "--node-rank", str(i),
                                "--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc-per-node", "2",
                                script, str(run)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for i in (0, 1)]
    for a in agents:
        _, err = a.communicate(timeout=300)
        assert a.returncode == 0, err[-3000:]
    got = {r: json.loads((run / f"rank{r}.json").read_text()) for r in range(4)}
    want = {r: json.loads((ref / f"rank{r}.json").read_text()) for r in range(4)}
    for r in range(4):
        assert got[r]["backend"] == "ccddp" and got[r]["sum_ok"]
        for p, q in zip(got[r]["params"], want[r]["params"]):
            assert torch.allclose(torch.tensor(p), torch.tensor(q), atol=1e-5), r
    # Socket writes by peer port: -1 is a socket with no IP peer (the domains' AF_UNIX
    # links); every other file is a TCP connection, whose destination the host's store chose.
    owner = {port: r for r in range(4) for port in got[r]["ports"]}
    by_pid = {got[r]["pid"]: r for r in range(4)}
    local, tcp_between_ranks, tcp = b"", b"", b""
    for f in wire.glob("wire.*.*"):
        _, pid, peer = f.name.rsplit(".", 2)
        if int(pid) not in by_pid:
            continue                                  # the agents
        if int(peer) == -1:
            local += f.read_bytes()
            continue
        tcp += f.read_bytes()
        if owner.get(int(peer)) is not None:
            tcp_between_ranks += f.read_bytes()
    raw = [markers(r).numpy().tobytes() for r in range(4)]
    probes = [b[j:j + 16] for b in raw for j in range(0, len(b) - 16, 256)]
    # Plaintext did travel inside each node (so the search would see a leak), and only on
    # the local links: no TCP connection of any rank carried a marker.
    assert tcp_between_ranks and found(probes, local), "the recording saw both kinds of link"
    assert not found(probes, tcp)


def test_train_measures_a_run_over_trust_domains(tmp_path):
    """``ccddp train --trust-domains``: one domain of both ranks, so DDP's gradient
    all-reduces seal nothing (the bounce path still does), and the run says which map it used."""
    import json
    import os
    import subprocess
    import sys

    from wire_util import HERE, SRC

    out = tmp_path / "train.json"
    done = subprocess.run([sys.executable, "-m", "ccddp.cli", "train", "--workload", "graphsage", "--size", "tiny",
                           "--world-size", "2", "--cc", "on", "--steps", "2", "--warmup", "1",
                           "--trust-domains", "[[0,1]]", "--json", str(out)],
                          env=child_env(dict(CCDDP_GROUP_SECRET=SECRET)), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(out.read_text())
    assert run["settings"]["trust_domains"] == [[0, 1]]
    assert run["seals_per_rank"] == 0, "gradients were sealed inside one domain"
    assert run["bounce_seals_per_iteration"] > 0


def test_selftest_attacks_the_links_across_domains(tmp_path):
    """``ccddp selftest --trust-domains``: 4 ranks as 2 domains of 2. Every attack on the
    hierarchical collectives strikes shard 0's sealed ring across domains (rank 0 in
    domain 0 -> rank 2 in domain 1) and is caught there, by rank 2, at the tampered frame;
    the links inside each domain are stated as plaintext by design, not attacked."""
    import json
    import subprocess
    import sys

    from _security_util import worker_env

    out = tmp_path / "rows.json"
    attacks, collectives = "flip,replay,splice-link,drop,stall", "all_reduce,reduce_scatter,broadcast"
    proc = subprocess.run([sys.executable, "-m", "ccddp.cli", "selftest", "--world-size", "4",
                           "--trust-domains", "[[0,1],[2,3]]", "--attacks", attacks, "--collectives", collectives,
                           "--json", str(out)], env=worker_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "15 of 15 cases passed" in proc.stdout
    assert "plaintext by design" in proc.stdout
    result = json.loads(out.read_text())
    assert result["trust_domains"] == [[0, 1], [2, 3]]
    assert [(d["domain"], d["links"]) for d in result["plaintext_links"]] == [([0, 1], ["0<->1"]), ([2, 3], ["2<->3"])]
    rows = result["rows"]
    assert len(rows) == 15
    for r in rows:
        assert r["passed"] is True, r
        assert "rank 0 (domain 0) -> rank 2 (domain 1)" in r["expected"], r
        if r["attack"] == "stall":
            # A stalled frame leaves both ends of the link waiting on each other (rank 2 for
            # the frame, rank 0 for rank 2's next one): the row names whichever timer fired
            # first, and under load that is either end (seen: rank 0 after 2.1 s).
            assert r["observed"].startswith(("PeerTimeoutError at rank 2", "PeerTimeoutError at rank 0")), r
        else:
            assert r["observed"].startswith("IntegrityError at rank 2: 0->1"), r


def test_launch_takes_the_trust_domains_and_keeps_the_other_settings(monkeypatch):
    import json

    from ccddp.cli.cmd_launch import own_options, settings_with
    from ccddp.errors import ConfigError

    own, rest = own_options(["--trust-domains", "[[0,1],[2,3]]", "--nproc-per-node", "4", "x.py"])
    assert (own.trust_domains, rest) == ([[0, 1], [2, 3]], ["--nproc-per-node", "4", "x.py"])
    own, rest = own_options(["--trust-domains=node", "x.py"])
    assert (own.trust_domains, rest) == ("node", ["x.py"])
    assert own_options(["--nproc-per-node", "2", "x.py", "--trust-domains", "node"])[0].trust_domains is None  # the script's
    for bad in (["--trust-domains", '["01"]', "x.py"], ["--trust-domains", "host", "x.py"], ["--trust-domains"]):
        with pytest.raises(ConfigError, match="trust-domains"):
            own_options(bad)
    merged = json.loads(settings_with({"CCDDP_SETTINGS": '{"segment_bytes": 8192}'}, "node"))
    assert merged == {"segment_bytes": 8192, "trust_domains": "node"}
    with pytest.raises(ConfigError, match="CCDDP_SETTINGS"):
        settings_with({"CCDDP_SETTINGS": '{"segment_bytes": "big"}'}, "node")


def test_a_launch_with_trust_domains_runs_its_ranks_in_them(tmp_path):
    import json
    import subprocess
    import sys

    from dist_util import child_env

    script = tmp_path / "domains.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(4)\n"
        "dist.all_reduce(t)\n"
        "import json, sys\n"
        "open(sys.argv[1] + f'/rank{dist.get_rank()}.json', 'w').write(json.dumps("
        "[dist.group.WORLD.domains.as_lists(), t.tolist()]))\n"
        "dist.destroy_process_group()\n")
    env = child_env({"CCDDP_GROUP_SECRET": SECRET, "OMP_NUM_THREADS": "1"})
    env.pop("CCDDP_SETTINGS", None)
    done = subprocess.run([sys.executable, "-m", "ccddp.cli", "launch", "--trust-domains", "[[0,1]]",
                           "--nproc-per-node", "2", str(script), str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for r in (0, 1):            # one file a rank: their printed lines can interleave
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got == [[[0, 1]], [2.0, 2.0, 2.0, 2.0]], (r, got)
