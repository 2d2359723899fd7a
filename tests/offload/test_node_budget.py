"""The offload mirrors' host budget is the node's, whatever each rank knows (issue 32 item 4).

NeMo-RL and Ray start workers with RANK / WORLD_SIZE / LOCAL_RANK only, so a budget per process
took each rank for the node's only one: every rank could page-lock half of MemAvailable. Here
three real processes (multiprocessing spawn, budget_child.py) on one "node" of 8 MiB MemAvailable
each offload 3 MiB of Adam state through NeMo-RL's move_optimizer with colo-shim: the node's budget
is 4 MiB, so one rank's mirrors fit and the others must take the original path (one warning each),
whatever order their claims reach the ledger in. Each test's ledger lives in its tmp_path
(COLO_SHIM_LEDGER_DIR), and must be gone when the last rank has left.
"""

import json
import multiprocessing
import os
import queue

import pytest

from helpers import doubles_path, last_json, run_python

pytestmark = pytest.mark.timeout(240)  # a safety net for hung children; the assertions are on their answers
MIB = 1 << 20
NODE = 8 * MIB  # every rank's MemAvailable unless a test says otherwise: a node budget of 4 MiB
STATE = 3 * MIB + 4096  # what one rank's mirrors take: two 1.5 MiB moments and a page for `step`


class Ranks:
    def __init__(self, tmp_path, mems):
        self.dir = tmp_path / "ledger"
        self.dir.mkdir()
        self.env = env = {"COLO_SHIM_LEDGER_DIR": str(self.dir), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
        paths = [os.path.dirname(os.path.abspath(__file__)), *doubles_path("v0_7")]
        ctx = multiprocessing.get_context("spawn")
        self.commands = [ctx.Queue() for _ in mems]
        self.answers = [ctx.Queue() for _ in mems]
        from budget_child import rank

        self.procs = [ctx.Process(target=rank, args=(i, len(mems), mem, env, paths, self.commands[i],
                                                     self.answers[i])) for i, mem in enumerate(mems)]
        for p in self.procs:
            p.start()

    def send(self, i, command):
        self.commands[i].put(command)

    def answer(self, i) -> dict:
        """Rank i's answer; a rank that died instead is the failure, said with its exit status."""
        while True:
            try:
                return self.answers[i].get(timeout=1)
            except queue.Empty:
                if not self.procs[i].is_alive():
                    raise AssertionError(f"rank {i} exited {self.procs[i].exitcode} without answering") from None

    def ask(self, i, command) -> dict:
        self.send(i, command)
        return self.answer(i)

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i].join()

    def leave(self):
        for i, p in enumerate(self.procs):
            if p.is_alive():
                assert self.ask(i, "leave") == {"rank": i, "left": True}
                p.join()
                assert p.exitcode == 0, (i, p.exitcode)

    def close(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join()


@pytest.fixture
def ranks(tmp_path):
    made = []

    def start(mems):
        made.append(Ranks(tmp_path, mems))
        return made[-1]

    yield start
    for r in made:
        r.close()


def _ledger(dir_) -> dict:
    files = os.listdir(dir_)
    assert len(files) == 1, files
    with open(os.path.join(dir_, files[0])) as fh:
        return json.loads(fh.readline())


def test_ranks_that_know_only_their_rank_share_one_node_budget(ranks):
    node = ranks([NODE] * 3)
    for i in range(3):  # all at once: the claims race for the ledger's lock
        node.send(i, "offload")
    first = [node.answer(i) for i in range(3)]
    assert sum(a["held"] for a in first) <= NODE // 2, [a["held"] for a in first]  # today: 3 x 3 MiB
    assert sorted(a["held"] for a in first) == [0, 0, STATE]
    assert sum(a["locked"] for a in first) == STATE  # page-locked: only the one rank's mirrors
    for a in first:  # every rank's state reached the host, by mirrors or by NeMo-RL's own body
        assert a["equal"] and not any(a["on_device"]), a
    for i in range(3):
        node.ask(i, "reload")
    second = [node.ask(i, "offload") for i in range(3)]
    holder, holder_pid = next((a["rank"], a["pid"]) for a in first if a["held"])  # the first to claim fixed it
    for a in second:
        assert a["equal"] and not any(a["on_device"]), a
        report, said = a["report"], [w for w in a["warnings"] if "offload mirrors not used" in w]
        if a["rank"] == holder:
            assert a["held"] == STATE and a["mirrored"] == 3 and report["reused"] == 3 and said == [], a
            continue
        assert a["held"] == 0 and a["mirrored"] == 0 and report["over_budget"] == 2, a
        assert len(said) == 1 and "over the node's budget of 0.00391 GiB" in said[0], said  # one warning, 2 calls
        assert report["budget_gib"] == round(NODE / 2 / (1 << 30), 3) and report["node_processes"] == 3, report
    ledger = _ledger(node.dir)
    assert ledger["budget"] == NODE // 2 and len(ledger["rows"]) == 3
    assert sum(r.get("refused", 0) for r in ledger["rows"].values()) == 4
    assert sum(r.get("mirrors", 0) for r in ledger["rows"].values()) == STATE
    # `colo-shim doctor` on the node, in the job's environment, reads the ledger while the job runs
    proc = run_python("import sys; from colo_shim.cli import main; sys.exit(main(sys.argv[1:]))",
                      args=("doctor",), env=node.env, timeout=120)
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "(host budget per node)" in line)
    rest = lines[at + 1:]
    wrapped = rest[:next((i for i, x in enumerate(rest) if not x.startswith(" ")), len(rest))]
    row = " ".join([lines[at]] + [x.strip() for x in wrapped])  # doctor wraps long reasons at 160 columns
    assert " 0.0 GiB " in row and "3 processes hold 0.0 GiB" in row and f"fixed by pid {holder_pid}" in row, row
    assert "offloads over the budget: 4, each took the original path" in row, row
    node.leave()
    assert os.listdir(node.dir) == []  # the last rank to leave removed the ledger


def test_a_dead_ranks_mirrors_are_not_counted(ranks):
    node = ranks([NODE, NODE])
    assert node.ask(0, "offload")["held"] == STATE
    assert node.ask(1, "offload")["held"] == 0  # the node's budget is rank 0's now; today: 3 MiB here too
    dead = node.procs[0].pid
    node.kill(0)  # SIGKILL: no exit handler runs, its row stays in the ledger
    assert str(dead) in _ledger(node.dir)["rows"]
    node.ask(1, "reload")
    again = node.ask(1, "offload")
    assert again["held"] == STATE and again["mirrored"] == 3 and again["report"]["node_processes"] == 1, again
    assert list(_ledger(node.dir)["rows"]) == [str(again["pid"])]
    node.leave()
    assert os.listdir(node.dir) == []


def test_ranks_reading_different_mem_available_agree_on_one_budget(ranks):
    node = ranks([NODE, 8 * NODE])  # rank 1 reads MemAvailable at another moment: 64 MiB
    low = node.ask(0, "offload")
    high = node.ask(1, "offload")
    assert low["report"]["budget_gib"] == high["report"]["budget_gib"] == round(NODE / 2 / (1 << 30), 3)
    assert low["held"] == STATE and high["held"] == 0  # alone, rank 1's reading would have let it pin 32 MiB
    assert f"fixed by pid {low['pid']}" in high["report"]["budget_source"]  # the number rank 0 fixed
    node.leave()
    assert os.listdir(node.dir) == []


def test_without_a_ledger_each_process_takes_its_share_of_the_node(tmp_path):
    # the ledger's path is taken by a directory: no ledger can be made, so the budget is the node's divided
    # by a count the environment proves (the node's GPUs, else CUDA_VISIBLE_DEVICES), one warning, and the
    # original path for what does not fit
    child = run_python("""
        import json, os, torch
        from colo_shim.core import ledger, node
        from colo_shim.offload import budget, mirrors
        node.mem_available = lambda: 8 << 20
        os.makedirs(ledger.path())
        state = {"a": torch.zeros(192 << 10), "b": torch.zeros(192 << 10)}  # 0.75 MiB each
        ok = [mirrors.offload([(state, "a")], "a"), mirrors.offload([(state, "b")], "b")]
        print(json.dumps([ok, mirrors.held(), budget.share(), mirrors.report()["over_budget"], node.devices()]))
    """, env={"COLO_SHIM_LEDGER_DIR": str(tmp_path), "RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0",
              "CUDA_VISIBLE_DEVICES": "0,1,2,3", "LOCAL_WORLD_SIZE": None})
    ok, held, (cap, source), over, devices = last_json(child)
    assert cap == NODE // 2 // devices["count"] and "no ledger: IsADirectoryError" in source, source
    assert f"/ {devices['count']} ranks ({devices['source']})" in source, source
    if devices["source"] == "CUDA_VISIBLE_DEVICES":  # this machine has no GPU driver: the variable counts
        assert devices["count"] == 4 and ok == [True, False] and held == 3 << 18 and over == 1, (ok, held)
        assert child.stderr.count("offload mirrors not used") == 1, child.stderr
