"""The launch path under a hostile host: nothing the host's rendezvous store holds is
unpickled, a restarted attempt recovers with fresh keys, a gloo group under a ccddp
default group is sealed, the group secret reaches only the ranks, and a one-rank group
works (nothing leaves the process).

The host here is the test: it serves a rendezvous store on loopback, pre-loaded with a
pickle that would run code in whoever unpickles it.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
from collections import Counter
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from ccddp.bench.launch import AGENT
from dist_util import child_env
from wire_util import HERE, SECRET_HEX, SRC, build_wiretap, found, torchrun, wire_bytes

RUN_ID = "hostile-run"


class _Payload:
    """Unpickling this creates the file ``path``: proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _free_port() -> int:
    from ccddp.bench.launch import free_port

    return free_port()


@pytest.fixture()
def hostile_store(tmp_path):
    """A rendezvous store on loopback whose rendezvous state is a crafted pickle; yields
    (endpoint, the file the pickle creates if anything unpickles it)."""
    marker = tmp_path / "host-code-ran"
    port = _free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    store.set(f"torch.rendezvous.{RUN_ID}", base64.b64encode(pickle.dumps(_Payload(str(marker)))).decode())
    yield f"127.0.0.1:{port}", marker
    del store


def _env(**extra) -> dict:
    env = child_env(dict(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    env.update(extra)
    return env


def _ccddp(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ccddp.cli", *args], env=env or _env(), capture_output=True,
                          text=True, timeout=timeout)


def _launch_here(monkeypatch, ccddp_here, *args: str, env: dict | None = None) -> tuple[int, str]:
    """``ccddp launch ARGS`` in this process (conftest's ``ccddp_here``), for a launch that
    must be refused: its exit status and its stderr. A launch the guard wrongly let through
    still starts torchrun and its ranks as processes, where the hostile store's pickle and
    the ranks' files show it. ``env``: the variables the command sees besides this
    process's own (no ``PET_*``, no group secret)."""
    for name in [k for k in os.environ if k.startswith("PET_")] + ["CCDDP_GROUP_SECRET"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    return ccddp_here("launch", *args)


SCRIPT = str(HERE / "restart_main.py")


def test_the_hostile_store_runs_code_in_torchruns_dynamic_rendezvous(hostile_store, tmp_path):
    """The attack is real: plain torchrun's c10d rendezvous unpickles the store's state."""
    endpoint, marker = hostile_store
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    endpoint, "--rdzv-id", RUN_ID, "--nproc-per-node", "1", "-m", "json.tool", os.devnull],
                   env=_env(), capture_output=True, text=True, timeout=120)
    assert marker.exists()


@pytest.mark.parametrize("rendezvous", [["--rdzv-backend", "c10d"], ["--rdzv_backend=etcd"],
                                        ["--rdzv-backend", "etcd-v2"]])
@pytest.mark.timeout(120)
def test_launch_refuses_a_dynamic_rendezvous_before_anything_reads_the_store(hostile_store, tmp_path, rendezvous,
                                                                             monkeypatch, ccddp_here):
    endpoint, marker = hostile_store
    code, stderr = _launch_here(monkeypatch, ccddp_here, *rendezvous, "--rdzv-endpoint", endpoint, "--rdzv-id", RUN_ID,
                                "--nproc-per-node", "2", SCRIPT, str(tmp_path))
    assert code == 2
    assert not marker.exists(), "the host's pickle ran"
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccddp: error: ")
    assert "--master-addr" in lines[0] and "static" in lines[0]
    assert not list(tmp_path.glob("attempt*")), "no rank started"


@pytest.mark.parametrize("pet", [{"PET_RDZV_BACKEND": "c10d"}, {"PET_RDZV_BACKEND": "etcd-v2"}],
                         ids=["c10d", "etcd-v2"])
@pytest.mark.timeout(120)
def test_ccddps_own_launches_ignore_pet_variables_that_ask_for_a_dynamic_rendezvous(pet, hostile_store):
    """``ccddp train``/``bench``/``selftest``/``characterize``/``calibrate`` spell out
    their static rendezvous, but torchrun takes every option they leave out from a
    ``PET_*`` variable: the host setting ``PET_RDZV_BACKEND`` (and the endpoint of its
    store) would make their agent unpickle the store's state. No ``PET_*`` variable
    reaches their agent: the launch runs on its static rendezvous and the store is never
    read."""
    from ccddp.bench.launch import job_env, torchrun as launch_ranks

    endpoint, marker = hostile_store
    env = job_env({**_env(), **pet, "PET_RDZV_ENDPOINT": endpoint, "PET_RDZV_ID": RUN_ID})
    launch_ranks("platform", [], nproc=1, env=env, timeout_s=90, quiet=True)
    assert not marker.exists(), "the host's pickle ran"


@pytest.mark.parametrize("argv", [["--nnodes", "1:2"], ["--nnodes", "2"]])
@pytest.mark.timeout(120)
def test_launch_needs_a_fixed_node_count_and_node_0s_address(argv, tmp_path, monkeypatch, ccddp_here):
    code, stderr = _launch_here(monkeypatch, ccddp_here, *argv, "--nproc-per-node", "1", SCRIPT, str(tmp_path),
                                env={"CCDDP_GROUP_SECRET": SECRET_HEX})
    assert code == 2 and stderr.startswith("ccddp: error: ")
    assert "--master-port" in stderr


@pytest.mark.parametrize("argv", [["--nproc-per-node", "2"], ["--nnodes", "1", "--nproc-per-node", "2"],
                                  ["--nnodes", "1:1"]])
def test_every_single_node_launch_gets_the_static_rendezvous(argv):
    """torchrun switches a one-node launch without ``--master-port`` to the c10d
    rendezvous; what ccddp launch hands torchrun never does."""
    from torch.distributed.run import get_args_parser

    from ccddp.cli.cmd_launch import torchrun_argv

    ns = get_args_parser().parse_args(torchrun_argv([*argv, "train.py", "--lr", "1"], {}))
    assert ns.rdzv_backend == "static" and not ns.standalone
    assert ns.master_addr == "127.0.0.1" and ns.master_port is not None
    assert ns.training_script == "ccddp.backend.intercept" and ns.training_script_args == ["train.py", "--lr", "1"]


# Every way to ask torchrun for a dynamic rendezvous: an option, any unambiguous prefix of
# it, or its PET_* variable (torchrun's options take their defaults from PET_<OPTION>).
DYNAMIC = {
    "--standalone": (["--standalone"], {}),
    "--stand": (["--stand"], {}),
    "--rdzv_backend c10d": (["--rdzv_backend", "c10d"], {}),
    "--rdzv-backend=c10d": (["--rdzv-backend=c10d"], {}),
    "--rdzv-b c10d": (["--rdzv-b", "c10d"], {}),
    "PET_STANDALONE=1": ([], {"PET_STANDALONE": "1"}),
    "PET_RDZV_BACKEND=c10d": ([], {"PET_RDZV_BACKEND": "c10d"}),
    "--nnodes 1:2": (["--nnodes", "1:2"], {}),
    "PET_NNODES=1:2": ([], {"PET_NNODES": "1:2"}),
}


@pytest.mark.parametrize("case", DYNAMIC)
def test_torchrun_reads_each_spelling_as_a_dynamic_rendezvous(case, monkeypatch):
    """The cases below are real: torchrun's own parser, in the environment given, resolves
    each to --standalone, a c10d backend or a node range."""
    from torch.distributed.run import get_args_parser

    argv, env = DYNAMIC[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ns = get_args_parser().parse_args([*argv, "train.py"])
    assert ns.standalone or ns.rdzv_backend == "c10d" or ns.nnodes == "1:2"


@pytest.mark.parametrize("case", DYNAMIC)
@pytest.mark.timeout(120)
def test_launch_refuses_every_spelling_of_a_dynamic_rendezvous(case, hostile_store, tmp_path, monkeypatch, ccddp_here):
    """However it is asked for, a dynamic rendezvous is refused in one line before torchrun
    starts: the host's store (which holds a pickle that would create a file) is never read
    by an agent, and no rank runs."""
    endpoint, marker = hostile_store
    argv, env = DYNAMIC[case]
    # The dynamic cases point at the hostile store; the static rest of the launch is valid.
    target = {"PET_RDZV_ENDPOINT": endpoint, "PET_RDZV_ID": RUN_ID}
    code, stderr = _launch_here(monkeypatch, ccddp_here, *argv, "--nproc-per-node", "2", SCRIPT, str(tmp_path),
                                env={**target, **env})
    assert code == 2, (code, stderr[-2000:])
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccddp: error: "), stderr[-2000:]
    assert "static" in lines[0] or "--nnodes N" in lines[0]
    assert not marker.exists(), "the host's pickle ran"
    assert not list(tmp_path.glob("attempt*")), "a rank started"


def test_pet_variables_become_options_and_never_reach_torchrun():
    """A PET_* variable that asks for nothing dynamic is kept as the option it stands for
    (so it is checked like one), and torchrun's environment holds no PET_* variable and no
    group secret."""
    from torch.distributed.run import get_args_parser

    from ccddp.cli.cmd_launch import child_environment, torchrun_argv

    environ = {"PET_NPROC_PER_NODE": "3", "PET_MASTER_PORT": "29611", "PET_MODULE": "0", "PET_UNKNOWN": "x",
               "CCDDP_GROUP_SECRET": SECRET_HEX, "HOME": "/home/u"}
    argv = torchrun_argv(["--nproc-per-node", "2", "train.py"], environ)
    assert child_environment(environ) == {"HOME": "/home/u"}
    ns = get_args_parser().parse_args(argv)
    assert ns.nproc_per_node == "2", "the spelled option wins over the variable, as in torchrun"
    assert ns.master_port == 29611 and ns.rdzv_backend == "static" and not ns.standalone
    assert torchrun_argv(["train.py"], {"PET_NPROC_PER_NODE": "3"})[0] == "--nproc-per-node=3"


@pytest.mark.parametrize("argv, env, says", [
    (["--nproc-per-node", "two"], {}, "--nproc-per-node two: Unsupported nproc_per_node value: two"),
    (["--nproc-per-node", "0"], {}, "--nproc-per-node 0: a node needs at least one rank"),
    (["--nnodes", "0", "--master-addr", "127.0.0.1", "--master-port", "29511"], {},
     "--nnodes 0: a launch needs at least one node"),
    (["--max-restarts", "-1"], {}, "--max-restarts -1: give 0 or more"),
    (["--nproc-per-node", "2"], {"CCDDP_SETTINGS": '{"segment_byte": 4096}'},
     "CCDDP_SETTINGS: unknown setting 'segment_byte'"),
], ids=["nproc-word", "nproc-0", "nnodes-0", "restarts-negative", "bad-setting"])
@pytest.mark.timeout(120)
def test_a_value_torchrun_would_fail_on_is_one_line_before_any_rank(argv, env, says, tmp_path, monkeypatch,
                                                                  ccddp_here):
    """Values torchrun's parser takes but torchrun (or every rank) then fails on with a
    traceback are refused by the launch in one line, before anything starts."""
    code, stderr = _launch_here(monkeypatch, ccddp_here, *argv, SCRIPT, str(tmp_path),
                                env={"CCDDP_GROUP_SECRET": SECRET_HEX, **env})
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ccddp: error: {says}"), stderr[-2000:]
    assert not list(tmp_path.glob("attempt*")), "a rank started"


@pytest.mark.timeout(120)
def test_a_usage_error_is_one_line(tmp_path, monkeypatch, ccddp_here):
    code, stderr = _launch_here(monkeypatch, ccddp_here, "--rdzv", "c10d", SCRIPT, str(tmp_path))
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccddp: error: torchrun's options: ambiguous option")


def test_a_restarted_attempt_recovers_with_fresh_keys(tmp_path):
    done = _ccddp("launch", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.5", SCRIPT,
                  str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {(a, r): json.loads((tmp_path / f"attempt{a}-rank{r}.json").read_text()) for a in (0, 1) for r in (0, 1)}
    # One session per attempt, the same on both ranks, new in the restart.
    assert runs[0, 0]["session"] == runs[0, 1]["session"] != runs[1, 0]["session"] == runs[1, 1]["session"]
    keys = {a: {k for r in (0, 1) for k, _ in runs[a, r]["nonces"]} for a in (0, 1)}
    assert keys[0] and keys[1] and not keys[0] & keys[1], "the restart reused a key"
    # The ledger over both attempts: each (key, nonce) taken once by its sealer and once by its opener.
    taken = Counter((k, n) for run in runs.values() for k, n in run["nonces"])
    assert taken and set(taken.values()) == {2}


def test_a_gloo_group_under_a_ccddp_default_group_is_sealed(tmp_path):
    from subgroup_main import marker_values

    lib = build_wiretap(tmp_path)
    (tmp_path / "wire").mkdir()
    done = torchrun([str(HERE / "subgroup_main.py"), str(tmp_path)], wiretap=lib, wire_dir=tmp_path / "wire",
                    timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for r in (0, 1):
        seen = json.loads((tmp_path / f"rank{r}.json").read_text())
        for name in ("new_group gloo", "new_group cpu:gloo", "new_subgroups", "device mesh"):
            assert seen[name]["correct"] and "ccddp" in seen[name]["backend"], (name, seen[name])
        assert seen["checkpoint"] is True
        assert seen["mpi"].startswith("ConfigError: ccddp cannot seal the mpi backend")
    raw = [marker_values(i).numpy().tobytes() for i in range(4)]
    markers = [b[j:j + 16] for b in raw for j in range(0, len(b) - 16, 512)]
    assert not found(markers, wire_bytes(tmp_path / "wire"))


@pytest.fixture(scope="module")
def given_secret_launch(tmp_path_factory):
    """One ``ccddp launch`` with CCDDP_GROUP_SECRET given, of secret_main.py (which also
    saves what environ_main.py saves), read by the two tests below."""
    out = tmp_path_factory.mktemp("given-secret")
    done = _ccddp("launch", "--nproc-per-node", "2", str(HERE / "secret_main.py"), str(out),
                  env=_env(CCDDP_GROUP_SECRET=SECRET_HEX))
    assert done.returncode == 0, done.stderr[-3000:]
    return done, out


def test_the_group_secret_reaches_the_ranks_only(given_secret_launch):
    done, out = given_secret_launch
    for r in (0, 1):
        seen = (out / f"rank{r}.txt").read_text()
        assert "subprocess sees: <absent>" in seen and "data-loader worker sees: <absent>" in seen
        assert "all_reduce: [2.0" in seen, "the ranks still had the secret for their group"
    written = [p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()]
    assert len(written) >= 10
    for text in (done.stdout, done.stderr, *written):
        assert SECRET_HEX not in text and SECRET_HEX.upper() not in text


def test_the_launch_tells_its_ranks_the_job_size_the_command_line_gives(given_secret_launch):
    """``CCDDP_WORLD_SIZE`` (``--nnodes`` x ``--nproc-per-node``) reaches each rank from
    the launch itself, beside the ``WORLD_SIZE`` the rendezvous store gave it."""
    out = given_secret_launch[1]
    for r in (0, 1):
        block = (out / f"rank{r}-self.environ").read_bytes().split(b"\0")
        assert b"CCDDP_WORLD_SIZE=2" in block and b"WORLD_SIZE=2" in block, r


@pytest.mark.parametrize("launcher", ["ccddp launch", "ccddp train"])
def test_a_rank_the_rendezvous_puts_in_a_job_of_another_size_stops_in_one_line(launcher, tmp_path):
    """A host serving a node's agent from a store of its own can make that node a whole
    job (``WORLD_SIZE`` its own ranks): the rank, told the job's size by the launch, stops
    before it makes a group -- under ``ccddp launch`` (the interceptor) and in the ranks
    of ccddp's commands (``bench.worker``)."""
    script = tmp_path / "script.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group()\nprint('GROUP MADE')\n")
    env = _env(RANK="1", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               CCDDP_WORLD_SIZE="2", CCDDP_GROUP_SECRET=SECRET_HEX)
    if launcher == "ccddp launch":
        cmd = [sys.executable, "-m", "ccddp.backend.intercept", str(script)]
    else:
        cmd = [sys.executable, "-c", "from ccddp.bench.worker import init_from_env, run_worker\n"
                                     "run_worker(lambda: init_from_env(10) or print('GROUP MADE'))"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "GROUP MADE" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "this launch has 2 ranks, but the rendezvous put this rank in a job of 1" in lines[0], \
        done.stderr[-2000:]


def _check_environment_blocks(out) -> None:
    """/proc/<pid>/environ of the agent, each rank, a forked child and a subprocess (read
    while the ranks' group is in use) holds neither the secret nor a CCDDP_GROUP_SECRET
    variable."""
    blocks = {p.name: p.read_bytes() for p in out.glob("*.environ")}
    assert len(blocks) == 8, sorted(blocks)
    for r in (0, 1):
        assert AGENT.encode() in (out / f"rank{r}-agent.cmdline").read_bytes()
    for name, block in blocks.items():
        assert b"PATH=" in block, f"{name}: not an environment block"
        assert SECRET_HEX.encode() not in block and SECRET_HEX.upper().encode() not in block, name
        assert b"CCDDP_GROUP_SECRET=" not in block, name
    assert b"CCDDP_GROUP_SECRET_FILE=" in blocks["rank0-agent.environ"], "the agent is told where the secret is"
    # The rank took the path out of os.environ: what it executes later is not told it (a fork
    # shares the rank's original block, which names the path, never the secret).
    assert b"CCDDP_GROUP_SECRET_FILE=" not in blocks["rank0-subprocess.environ"]


def test_a_script_under_ccddp_launch_runs_with_the_collector_on(given_secret_launch):
    """The script's process froze what torch's and ccddp's imports made (ccddp.startup)
    before the script started, and the script runs with Python's cycle collector on."""
    for r in (0, 1):
        seen = json.loads((given_secret_launch[1] / f"rank{r}-collector.json").read_text())
        assert seen["enabled"] and seen["frozen"] > 100_000, seen


def test_no_environment_block_of_the_launch_holds_the_secret_given(given_secret_launch):
    _check_environment_blocks(given_secret_launch[1])


def test_no_environment_block_of_the_launch_holds_the_secret_it_made(tmp_path):
    """The same when no secret is given and the launch makes one."""
    env = _env()
    env.pop("CCDDP_GROUP_SECRET", None)
    env.pop("CCDDP_GROUP_SECRET_FILE", None)
    done = _ccddp("launch", "--nproc-per-node", "2", str(HERE / "environ_main.py"), str(tmp_path), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_environment_blocks(tmp_path)


@pytest.mark.parametrize("given", [True, False], ids=["CCDDP_GROUP_SECRET given", "secret made by the command"])
def test_no_environment_block_of_a_ccddp_commands_ranks_holds_the_secret(given, tmp_path):
    """``ccddp train``, ``bench``, ``selftest``, ``characterize`` and ``calibrate`` start
    their ranks through ``ccddp.bench.launch.torchrun``: the secret it makes, or the one the
    user gave, reaches the ranks through a sealed memfd, not in torchrun's or the ranks'
    environment (before: ``job_env`` put a fresh secret into it)."""
    from dist_util import child_env

    from ccddp.bench.launch import torchrun

    env = child_env({"OMP_NUM_THREADS": "1"})
    env.pop("CCDDP_GROUP_SECRET_FILE", None)
    env.pop("CCDDP_GROUP_SECRET", None)
    if given:
        env["CCDDP_GROUP_SECRET"] = SECRET_HEX
    torchrun("environ_main", [str(tmp_path), "ccddp"], nproc=2, env=env, timeout_s=240, quiet=True)
    blocks = {p.name: p.read_bytes() for p in tmp_path.glob("*.environ")}
    assert len(blocks) == 8, sorted(blocks)
    for name, block in blocks.items():
        assert b"PATH=" in block, f"{name}: not an environment block"
        assert SECRET_HEX.encode() not in block and SECRET_HEX.upper().encode() not in block, name
        assert b"CCDDP_GROUP_SECRET=" not in block, name
    assert b"CCDDP_GROUP_SECRET_FILE=" in blocks["rank0-agent.environ"], "the agent is told where the secret is"


def _one_rank(rank, n):
    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET_HEX
    import ccddp.backend  # noqa: F401

    pg = dist.new_group(backend="ccddp")
    t = torch.arange(6.0)
    dist.all_reduce(t, group=pg)
    out = [torch.empty(6)]
    dist.all_gather(out, t, group=pg)
    objs = [None]
    dist.all_gather_object(objs, {"rank": rank}, group=pg)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2), process_group=pg)
    model(torch.ones(4, 3)).sum().backward()
    return t.tolist(), out[0].tolist(), objs, dist.get_backend(pg)


def test_a_one_rank_group_works_like_gloos():
    from dist_util import run_ranks

    (t, gathered, objs, backend), = run_ranks(_one_rank, 1, timeout=120)
    assert t == gathered == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert objs == [{"rank": 0}] and backend == "ccddp"


def test_a_measuring_command_says_it_does_not_use_ccddp_settings(monkeypatch, capsys):
    """``ccddp train``/``bench``/... build their groups from their own options: a
    ``CCDDP_SETTINGS`` exported for the user's scripts is said to be unused (once, before
    the ranks start), not silently ignored by a measurement the user thinks it shaped."""
    import ccddp.bench.launch as launch

    started = []
    monkeypatch.setattr(launch, "supervised",
                        lambda cmd, env, **kw: started.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", ""))
    launch.torchrun("platform", [], nproc=1, env={"CCDDP_SETTINGS": '{"segment_bytes": 4096}'})
    err = capsys.readouterr().err
    assert started and err.count("\n") == 1 and err.startswith("ccddp: warning: CCDDP_SETTINGS is set but not used")
    launch.torchrun("platform", [], nproc=1, env={})
    assert capsys.readouterr().err == ""
