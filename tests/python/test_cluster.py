"""A cluster on one machine: 1, 2 and 3 simulated nodes (processes with torchrun's environment: RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK), each node with a cache directory of its own, read epochs of a dataset
on the S3 test server, and of the same dataset on nginx.  What must hold:
- the bytes the store sends for the whole cluster are at most 1.05x the dataset's an epoch (each node reads and
  caches only its share; without node placement every node would fetch all of it, N times the dataset).  Two
  epochs are read: an epoch's last windows are followed by the next epoch's first, read ahead (as a training
  loop that goes on wants them), and those count too;
- one epoch on each node needs at most 1.1x its share (the dataset / nodes) of cache; and with the cache limited
  to that (SLUICE_CACHE_LIMIT), the next epoch (another share: shards move between nodes each epoch) fits by
  letting the last epoch's copies go first, with no more bytes from the store;
- every record is seen once in the epoch (but the documented fill of the last batch), and every rank gets the
  same number of batches;
- an epoch stopped on 2 nodes resumes exactly on 3."""
import json
import os
import subprocess

import pytest

import sluice

import webserver
from conftest import SLUICE, run_ranks

N, B = 1536, 4  # records of about 3 KB in 768 shards of two: 4.6 MB (7.7 MB with their headers)
WINDOW = 8 << 10  # shuffle windows of 8 KiB: a window is a small part of a node's share, as in real use

EPOCHS = r"""
import json, sys, sluice
ds = sluice.Dataset(sys.argv[1])
state = json.loads(sys.argv[2]) if sys.argv[2] != "-" else None
stop, epochs = int(sys.argv[3]), int(sys.argv[5])
ld = sluice.Loader(ds, %d, seed=11, window_bytes=int(sys.argv[4]))
if state:
    ld.load_state_dict(state)
ids, batches = [[] for _ in range(epochs)], [0] * epochs
for e in range(epochs):
    if e:
        ld.set_epoch(e)
    for b in ld:
        ids[e] += [int(x) for x in b["ids"]]
        batches[e] += 1
        if batches[e] == stop:
            break
print(json.dumps({"ids": ids, "batches": batches, "state": ld.state_dict(), "nodes": ld._opt.nodes}))
""" % B


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster")
    with open(d / "in.jsonl", "w") as f:
        for i in range(N):
            f.write(json.dumps({"n": i, "pad": "%08d" % i * (300 + i % 100)}) + "\n")
    out = d / "ds"
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(d / "in.jsonl"), "--fields", "n,pad", "--shard-size", "6K",
                    "--quiet", str(out)], check=True, capture_output=True)
    assert len(os.listdir(out)) > 700
    return out


def _bytes(path):
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


def _cluster(url, nodes, local, tmp, env=None, state=None, stop=0, tag="a", epochs=1):
    """epochs (or stop batches of one) on nodes x local ranks; each node's cache directory is its own.  The ranks'
    reports, and the bytes of copies each node's cache holds at the end."""
    caches = [tmp / f"{tag}-node{g}" for g in range(nodes)]
    env_of = lambda r: {**(env or {}), "SLUICE_CACHE_DIR": str(caches[r // local])}  # noqa: E731
    out = run_ranks(EPOCHS, (url, json.dumps(state) if state else "-", stop, WINDOW, epochs), nodes * local,
                    nodes=nodes, env_of=env_of)
    assert {o["nodes"] for o in out} == {nodes}
    assert len({tuple(o["batches"]) for o in out}) == 1, [o["batches"] for o in out]  # equal batches, every rank
    held = [sum(os.path.getsize(c / n) for n in os.listdir(c) if n.endswith(".data")) for c in caches]
    return out, held


def _check_epochs(out, fill):
    for e in range(len(out[0]["ids"])):
        ids = [i for o in out for i in o["ids"][e]]
        assert set(ids) == set(range(N))  # every record
        assert len(ids) - N <= fill  # once, but the fill of the last batches


def _share(url, nodes, local, tmp, total, sent, env=None):
    """One epoch, then two with the cache limited to 1.1x a node's share: the store's bytes an epoch (sent())
    and the caches' footprint against the targets."""
    fill = B * nodes * local
    before = sent()
    out, held = _cluster(url, nodes, local, tmp, env=env, tag="one")
    _check_epochs(out, fill)
    one = sent() - before
    limit = int(1.1 * total / nodes)
    before = sent()
    out, limited = _cluster(url, nodes, local, tmp, env={**(env or {}), "SLUICE_CACHE_LIMIT": str(limit)},
                            tag="two", epochs=2)
    _check_epochs(out, fill)
    two = sent() - before
    print(f"{nodes} node(s): the store sent {one / total:.3f}x the dataset for one epoch (with the next one's first "
          f"windows), {two / 2 / total:.3f}x an epoch over two under the limit; one epoch's cache "
          f"{[round(h * nodes / total, 3) for h in held]}x a node's share, under the limit "
          f"{[round(h * nodes / total, 3) for h in limited]}x")
    assert one <= 1.05 * total and two / 2 <= 1.05 * total
    assert all(h <= 1.1 * total / nodes for h in held + limited), (held, limited)


@pytest.mark.parametrize("nodes,local", [(1, 2), (2, 2), (3, 1)])
def test_each_node_reads_and_caches_its_share_of_an_s3_dataset(s3, packed, tmp_path, nodes, local):
    prefix = f"cluster{nodes}"
    sluice.copy(str(packed), f"s3://pytest/{prefix}/", recursive=True)
    proxy = s3.sluice_server.fault_proxy(faults=())
    _share(f"s3://pytest/{prefix}", nodes, local, tmp_path, _bytes(packed), lambda: proxy.sent,
           env={"AWS_ENDPOINT_URL": proxy.endpoint})


def test_each_node_reads_its_share_of_an_http_dataset(packed, tmp_path):
    if webserver.NGINX is None:
        pytest.skip("nginx is absent (scripts/deps.sh test installs nginx-light)")
    with webserver.WebServer(packed.parent, tmp_path / "nginx") as web:
        _share(web.url("ds"), 3, 1, tmp_path, _bytes(packed), lambda: web.sent("/ds/"))


def test_an_epoch_stopped_on_two_nodes_resumes_exactly_on_three(s3, packed, tmp_path):
    sluice.copy(str(packed), "s3://pytest/resume/", recursive=True)
    first, _ = _cluster("s3://pytest/resume", 2, 2, tmp_path, stop=40, tag="first")
    states = {json.dumps(o["state"], sort_keys=True) for o in first}
    assert len(states) == 1  # every rank agrees on where the epoch stands
    rest, _ = _cluster("s3://pytest/resume", 3, 1, tmp_path, state=json.loads(states.pop()), tag="rest")
    before, after = [i for o in first for i in o["ids"][0]], [i for o in rest for i in o["ids"][0]]
    assert len(before) == 2 * 2 * 40 * B and not set(before) & set(after[:N - len(before)])
    assert set(before + after) == set(range(N)) and len(before + after) - N <= B * 3


GLOO = r"""
import json, os, sys, torch.distributed as dist, sluice
dist.init_process_group("gloo")
ld = sluice.Loader(sluice.Dataset(sys.argv[1]), %d, seed=11, window_bytes=int(sys.argv[2]))
ids = [int(x) for b in ld for x in b["ids"]]
every = [None] * dist.get_world_size()
dist.all_gather_object(every, ids)
dist.destroy_process_group()
print(json.dumps({"nodes": ld._opt.nodes, "mine": len(ids), "all": every}))
""" % B


def test_nodes_as_a_gloo_process_group_over_http(packed, tmp_path):
    """The same under torch.distributed (gloo): the loader takes rank and world from the process group and the
    node count from torchrun's LOCAL_WORLD_SIZE; the ranks' ids, all-gathered, are one epoch."""
    pytest.importorskip("torch.distributed")
    if webserver.NGINX is None:
        pytest.skip("nginx is absent (scripts/deps.sh test installs nginx-light)")
    total = _bytes(packed)
    with webserver.WebServer(packed.parent, tmp_path / "nginx") as web:
        out = run_ranks(GLOO, (web.url("ds"), WINDOW), 4, nodes=2,
                        env_of=lambda r: {"SLUICE_CACHE_DIR": str(tmp_path / f"gloo-node{r // 2}")})
        sent = web.sent("/ds/")
    assert {o["nodes"] for o in out} == {2} and len({o["mine"] for o in out}) == 1
    ids = [i for rank in out[0]["all"] for i in rank]
    assert set(ids) == set(range(N)) and len(ids) - N <= B * 4
    assert sent <= 1.05 * total
