"""Checkpoint loaders side by side (issue #24): safetensors (and its prefetch loader, where the installed
safetensors has it: 0.9 on), fastsafetensors, the Run:ai Model Streamer,
InstantTensor and sluice load the same sharded safetensors checkpoint into one GPU, each at its defaults and at
the settings its documentation offers for speed; passes interleaved, cold (page cache dropped) and warm; fio
reads the same files (O_DIRECT) as the storage's own rate.  --modes save: the checkpoint loaded onto the GPU
(before the clock) and saved again as 5 GB shards, durable, by sluice.save and safetensors' save_file (and
fsync), beside fio writing as many bytes in as many files (O_DIRECT, synced at the end).  Each pass is a fresh process that starts CUDA
first, then times from the load call until every tensor's sum is computed on the GPU: a loader that returns
before its bytes land is timed to the end of its work, and the sums, checked against the writer's, fail one
that is fast and wrong.

    python3 bench/ckpt_bench.py --shape llama8b --layers 16 --modes cold,warm --reps 3 --out ckpt.json

Shapes: llama8b (Llama-3-8B: hidden 4096, 14336 MLP, GQA 8 of 32 heads, 128256 vocabulary; --layers of 32;
16 layers make 9.1 GB, the issue's checkpoint; --ranks N: N processes, one a GPU, each loading every tensor onto
its own, timed until the last holds them, GB/s of all ranks' bytes; the "process_group" contenders read once for
the group), llama70b (hidden 8192, 28672 MLP, GQA 8 of 64 heads; --layers of
80; with --tp RANK/WORLD that tensor-parallel rank's slices, by safetensors' get_slice and sluice's shard=, GB/s
of the slices' bytes), moe (Qwen3-30B-A3B-like: 128 experts of 768 x 2048 each
layer, thousands of small tensors; --layers of 48).  bf16, shards of 5 GB, as Hugging Face writes them.
"""
import argparse
import inspect
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from benchlib import GB, Results, child_json, drop_caches, free_port, side_by_side, warm  # noqa: E402

# Every loader as one run in a child: FILES (the shards, sorted), DIR (the checkpoint), DEV ("cuda:0").
# Each loader's module, imported before the clock: a process imports it once, whatever it then loads.
IMPORTS = {"safetensors": "import safetensors.torch", "safetensors_prefetch": "import safetensors",
           "fastsafetensors": "import fastsafetensors",
           "runai": "import runai_model_streamer", "instanttensor": "import instanttensor", "sluice": "import sluice"}

LOADERS = {
    "safetensors": """
from safetensors.torch import load_file
out = {}
for f in FILES:
    out.update(load_file(f, device=DEV))
""",
    # safetensors 0.9's own batched loader (vLLM's and transformers' pull requests adopt it): each file's loader
    # started before any tensor is taken, so the files' reads overlap.
    "safetensors_prefetch": """
from safetensors import safe_open
if not hasattr(safe_open, "prefetch"):
    raise SystemExit(f"safetensors {safetensors.__version__} has no safe_open.prefetch (0.9 on)")
out, handles, loaders = {}, [], []
for f in FILES:
    h = safe_open(f, framework="pt", device=DEV, backend=KW.get("backend", "mmap"))
    handles.append(h.__enter__())
    loaders.append(handles[-1].prefetch(threads=KW.get("threads", 8)))
for ld in loaders:
    for name, t in ld:
        out[name] = t
""",
    "fastsafetensors": """
from fastsafetensors import SafeTensorsFileLoader, SingleGroup
loader = SafeTensorsFileLoader(SingleGroup(), torch.device(DEV), nogds=True, **KW)
loader.add_filenames({0: FILES})
fb = loader.copy_files_to_device()
out = {k: fb.get_tensor(k) for k in list(loader.get_keys())}
""",
    "runai": """
from runai_model_streamer import SafetensorsStreamer
out = {}
with SafetensorsStreamer() as s:
    s.stream_files(FILES, device=DEV)
    for name, t in s.get_tensors():
        out[name] = t if t.is_cuda else t.to(DEV)
""",
    "instanttensor": """
from instanttensor import safe_open
out = {}
with safe_open(FILES, framework="pt", device=0, **KW) as f:
    for name, t in f.tensors():
        out[name] = t
""",
    "sluice": """
import sluice
out = sluice.load(DIR, device=DEV)
""",
}
# Under --ranks N (one process a GPU, as torchrun starts them): every rank loads the whole checkpoint onto its
# GPU; these read it once for the group and exchange over NCCL (PG: the torch.distributed group of all ranks).
GROUP_LOADERS = {
    "instanttensor": """
from instanttensor import safe_open
out = {}
with safe_open(FILES, framework="pt", device=RANK, process_group=PG, **KW) as f:
    for name, t in f.tensors():
        out[name] = t
""",
    "sluice": """
import sluice
out = sluice.load(DIR, device=DEV, process_group=PG)
""",
}
TP_RANK, TP_WORLD = 0, 1  # the maker sets them for each rank's sums; the children from CKPT_TP


def TP(name, shape=None):
    """One tensor-parallel rank's part, as Megatron and vLLM cut Llama: column-parallel weights (and the
    vocabulary) by rows, row-parallel ones by columns, norms whole; None: whole."""
    if TP_WORLD <= 1:
        return None
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight",
                      "embed_tokens.weight", "lm_head.weight")):
        return (0, TP_RANK, TP_WORLD)
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return (1, TP_RANK, TP_WORLD)
    return None


TP_RULE = inspect.getsource(TP)  # the same function in the children
# Loaders that read one rank's slices (the others load whole checkpoints only): safetensors' get_slice, sluice's
# shard=.
TP_LOADERS = {
    "safetensors": """
from safetensors import safe_open
out = {}
for f in FILES:
    with safe_open(f, framework="pt", device=DEV) as h:
        for k in h.keys():
            spec = TP(k)
            if spec is None:
                out[k] = h.get_tensor(k)
                continue
            dim, r, w = spec
            sl = h.get_slice(k)
            shape = sl.get_shape()
            step = -(-shape[dim] // w)
            idx = [slice(None)] * len(shape)
            idx[dim] = slice(min(r * step, shape[dim]), min(r * step + step, shape[dim]))
            out[k] = sl[tuple(idx)].to(DEV)
""",
    "sluice": """
import sluice
out = sluice.load(DIR, device=DEV, shard=TP)
""",
}

# The contenders: a loader at its defaults, or at the settings its documentation offers for speed.
VARIANTS = {
    "safetensors": ("safetensors", {}, {}),
    "safetensors prefetch": ("safetensors_prefetch", {}, {}),
    "safetensors prefetch pread": ("safetensors_prefetch", {"backend": "pread"}, {}),
    "fastsafetensors": ("fastsafetensors", {}, {}),
    "fastsafetensors max_threads=64": ("fastsafetensors", {"max_threads": 64}, {}),
    "runai": ("runai", {}, {}),
    "runai concurrency=64": ("runai", {}, {"RUNAI_STREAMER_CONCURRENCY": "64"}),
    "instanttensor": ("instanttensor", {}, {}),
    "instanttensor buffered": ("instanttensor", {"backend": "BUFFERED"}, {}),
    # Its I/O backends one by one (its default tries URING, then AIO; BUFFERED: URING_BUFFERED, then MMAP).
    "instanttensor AIO": ("instanttensor", {"backend": "AIO"}, {}),
    "instanttensor URING_BUFFERED": ("instanttensor", {"backend": "URING_BUFFERED"}, {}),
    "instanttensor MMAP": ("instanttensor", {"backend": "MMAP"}, {}),
    "instanttensor CUFILE": ("instanttensor", {"backend": "CUFILE"}, {}),
    "sluice": ("sluice", {}, {}),
    "instanttensor process_group": ("instanttensor", {"group": 1}, {}),
    "sluice process_group": ("sluice", {"group": 1}, {}),
    "sluice process_group 16M": ("sluice", {"group": 1}, {"SLUICE_MAX_TRANSFER_SIZE": "16M"}),
    "sluice process_group 16 threads x 8": ("sluice", {"group": 1}, {"SLUICE_THREADS": "16", "SLUICE_QUEUE_DEPTH": "8"}),
    # sluice's own settings, for the sweep (not its defaults).
    "sluice direct=never": ("sluice", {}, {"SLUICE_DIRECT": "never"}),
    "sluice read_gap=0": ("sluice", {}, {"SLUICE_READ_GAP": "0"}),
    "sluice read_gap=4K": ("sluice", {}, {"SLUICE_READ_GAP": "4K"}),
    "sluice 16M": ("sluice", {}, {"SLUICE_MAX_TRANSFER_SIZE": "16M"}),
    "sluice 16 threads x 8": ("sluice", {}, {"SLUICE_THREADS": "16", "SLUICE_QUEUE_DEPTH": "8"}),
    "sluice queue_depth=16": ("sluice", {}, {"SLUICE_QUEUE_DEPTH": "16"}),
    "sluice 16M x 2": ("sluice", {}, {"SLUICE_MAX_TRANSFER_SIZE": "16M", "SLUICE_QUEUE_DEPTH": "2"}),
    "sluice psync 16 threads 16M": ("sluice", {}, {"SLUICE_BACKEND": "psync", "SLUICE_THREADS": "16",
                                                   "SLUICE_MAX_TRANSFER_SIZE": "16M", "SLUICE_QUEUE_DEPTH": "2"}),
}

CHILD = """
import json, os, resource, sys, time
import torch
RANK, WORLD = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
DEV, DIR = f"cuda:{RANK}", sys.argv[1]
TP_RANK, TP_WORLD = (int(x) for x in os.environ.get("CKPT_TP", "0/1").split("/"))
%s
FILES = sorted(os.path.join(DIR, n) for n in os.listdir(DIR) if n.endswith(".safetensors"))
KW = json.loads(sys.argv[2])
KW.pop("group", None)
if KW.get("backend"):
    import instanttensor
    KW["backend"] = getattr(instanttensor.BackendPolicy, KW["backend"], None) or getattr(instanttensor.Backend, KW["backend"])
%s
torch.cuda.set_device(DEV)
torch.empty(1, device=DEV)  # CUDA started and the loader's module imported before the clock
# The sums' kernels loaded before the clock too (CUDA loads a module at its first launch): a pass times the load.
torch.stack([torch.zeros(8, dtype=torch.int16, device=DEV).sum(dtype=torch.int64)] * 2).tolist()
PG = None
if WORLD > 1:  # every rank starts the clock together and stops it when the last one is done
    import torch.distributed as dist
    dist.init_process_group("nccl", device_id=torch.device(DEV))
    PG = dist.group.WORLD
    dist.barrier()
torch.cuda.synchronize()
ru = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
%s
t_ret = time.perf_counter()  # the loader's call returned (its bytes may still be in flight)
torch.cuda.synchronize()  # every stream's queued work done: the tensors are ready for the first kernel
if WORLD > 1:
    dist.barrier()
secs = time.perf_counter() - t0
ru2 = resource.getrusage(resource.RUSAGE_SELF)
# After the clock: every tensor's sum on the GPU against the writer's, so a loader whose bytes are not all in place
# is caught.  (Until 2026-11-26 the sums ran inside the clock: 38 ms of a 10.8 GB load for every loader, which the
# link's pass does not pay.)
names = sorted(out)
got = torch.stack([out[k].contiguous().view(torch.int16).sum(dtype=torch.int64) for k in names]).tolist()
nbytes = sum(t.numel() * t.element_size() for t in out.values())
ref = json.load(open(os.path.join(DIR, "sums.json" if TP_WORLD == 1 else f"sums-tp{TP_RANK}of{TP_WORLD}.json")))
r = {"seconds": secs, "returned_s": t_ret - t0, "bytes": nbytes * WORLD, "tensors": len(out), "sums_ok": dict(zip(names, got)) == ref,
     "cpu_s": ru2.ru_utime + ru2.ru_stime - ru.ru_utime - ru.ru_stime,
     "on_gpu": all(t.device == torch.device(DEV) for t in out.values())}
if WORLD > 1:  # the group's: the slowest rank's seconds, every rank's CPU, every rank's sums
    each = [None] * WORLD
    dist.all_gather_object(each, r)
    r = dict(each[0], seconds=max(e["seconds"] for e in each), cpu_s=sum(e["cpu_s"] for e in each),
             sums_ok=all(e["sums_ok"] for e in each), on_gpu=all(e["on_gpu"] for e in each))
    dist.destroy_process_group()
if RANK == 0:
    print(json.dumps(r))
"""


def shapes(kind, layers):
    """(name, shape) of each tensor of the checkpoint, in Hugging Face's names."""
    if kind in ("llama8b", "llama70b"):
        h, f, kv, vocab = (4096, 14336, 1024, 128256) if kind == "llama8b" else (8192, 28672, 1024, 128256)
        yield "model.embed_tokens.weight", (vocab, h)
        for i in range(layers):
            p = f"model.layers.{i}."
            yield p + "input_layernorm.weight", (h,)
            for n, s in (("q", (h, h)), ("k", (kv, h)), ("v", (kv, h)), ("o", (h, h))):
                yield p + f"self_attn.{n}_proj.weight", s
            yield p + "post_attention_layernorm.weight", (h,)
            for n, s in (("gate", (f, h)), ("up", (f, h)), ("down", (h, f))):
                yield p + f"mlp.{n}_proj.weight", s
        yield "model.norm.weight", (h,)
        yield "lm_head.weight", (vocab, h)
    elif kind == "moe":
        h, e, f, heads = 2048, 128, 768, 32
        yield "model.embed_tokens.weight", (151936, h)
        for i in range(layers):
            p = f"model.layers.{i}."
            yield p + "input_layernorm.weight", (h,)
            for n, s in (("q", (heads * 128, h)), ("k", (4 * 128, h)), ("v", (4 * 128, h)), ("o", (h, heads * 128))):
                yield p + f"self_attn.{n}_proj.weight", s
            yield p + "post_attention_layernorm.weight", (h,)
            yield p + "mlp.gate.weight", (e, h)
            for x in range(e):
                for n, s in (("gate", (f, h)), ("up", (f, h)), ("down", (h, f))):
                    yield p + f"mlp.experts.{x}.{n}_proj.weight", s
        yield "model.norm.weight", (h,)
        yield "lm_head.weight", (151936, h)
    else:
        raise SystemExit(f"unknown shape {kind!r} (llama8b, llama70b, moe)")


def make(d, kind, layers, tp=(0, 1)):
    """The checkpoint at d (made once): bf16 random tensors, 5 GB shards and an index, written by
    sluice.save, and sums.json: the writer's sum of each tensor's 16-bit words."""
    if os.path.exists(os.path.join(d, "sums.json")) and (tp[1] <= 1 or os.path.exists(os.path.join(d, f"sums-tp0of{tp[1]}.json"))):
        return
    import torch
    import sluice
    g = torch.Generator(device="cuda").manual_seed(0)
    t = {n: torch.randn(s, generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16)
         for n, s in shapes(kind, layers)}
    sluice.save(t, d, max_shard_size=5 * 10**9)
    names = sorted(t)
    sums = dict(zip(names, torch.stack([t[k].view(torch.int16).sum(dtype=torch.int64) for k in names]).tolist()))
    with open(os.path.join(d, "sums.json"), "w") as f:
        json.dump(sums, f)
    for rank in range(tp[1] if tp[1] > 1 else 0):  # each rank's slices, for --tp
        globals().update(TP_RANK=rank, TP_WORLD=tp[1])
        part = {}
        for k in names:
            spec = TP(k)
            part[k] = t[k] if spec is None else torch.chunk(t[k], spec[2], dim=spec[0])[rank]
        with open(os.path.join(d, f"sums-tp{rank}of{tp[1]}.json"), "w") as f:
            json.dump(dict(zip(names, torch.stack([part[k].contiguous().view(torch.int16).sum(dtype=torch.int64)
                                                   for k in names]).tolist())), f)


def one_pass(d, variant, tp="0/1", ranks=1):
    """One load in fresh processes (ranks of them, one a GPU, started as torchrun starts them)."""
    loader, kw, env = VARIANTS[variant]
    code = (GROUP_LOADERS if kw.get("group") else TP_LOADERS if tp != "0/1" else LOADERS)[loader]
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", CHILD % (TP_RULE, IMPORTS[loader], code), d, json.dumps(kw)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, CKPT_TP=tp, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(ranks),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env)) for r in range(ranks)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode:
            raise RuntimeError(err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}")
    got = json.loads(outs[0][0].strip().splitlines()[-1])
    if not (got["sums_ok"] and got["on_gpu"]):
        raise RuntimeError(f"wrong tensors: {got}")
    got["gb_s"] = got["bytes"] / got["seconds"] / GB
    got["cpu_s_per_gb"] = got["cpu_s"] / (got["bytes"] / GB)
    return got


LINK = """
import os, sys, time, torch
d = sys.argv[1]
files = sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".safetensors"))
host = []
for f in files:  # each file's bytes in pinned memory, before the clock
    t = torch.empty(os.path.getsize(f), dtype=torch.uint8).pin_memory()
    with open(f, "rb") as fh:
        fh.readinto(t.numpy())
    host.append(t)
dev = [torch.empty_like(t, device="cuda:0") for t in host]
torch.cuda.synchronize()
t0 = time.perf_counter()
for a, b in zip(dev, host):
    a.copy_(b, non_blocking=True)
torch.cuda.synchronize()
print(sum(t.numel() for t in host), time.perf_counter() - t0)
"""


# Saves: the checkpoint, loaded onto the GPU before the clock, saved again to OUT as 5 GB shards, durable (on
# the disk when the call returns: sluice.save syncs; safetensors' files are synced after it, in the clock).
SAVE = """
import json, os, sys, time
import torch, sluice
DIR, OUT = sys.argv[1], sys.argv[2]
state = sluice.load(DIR, device="cuda:0")
torch.cuda.synchronize()
t0 = time.perf_counter()
%s
secs = time.perf_counter() - t0
print(json.dumps({"seconds": secs, "bytes": sum(t.numel() * t.element_size() for t in state.values())}))
"""
SAVERS = {
    "sluice.save": "sluice.save(state, OUT, max_shard_size=5 * 10**9)",
    "safetensors save_file + fsync": """
from safetensors.torch import save_file
def sync(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
os.makedirs(OUT, exist_ok=True)
shard, size, k = {}, 0, 0
for name in list(state) + [None]:
    if name is None or (shard and size + state[name].nbytes > 5 * 10**9):
        path = os.path.join(OUT, f"model-{k:05d}.safetensors")
        save_file(shard, path)
        sync(path)
        shard, size, k = {}, 0, k + 1
    if name is not None:
        shard[name], size = state[name], size + state[name].nbytes
sync(OUT)
""",
}


def _save_out(d):
    """The empty directory beside the checkpoint that a save pass writes into."""
    out = os.path.join(os.path.dirname(d), "save-out")
    subprocess.run(["rm", "-rf", out], check=True)
    return out


def save_pass(d, saver):
    """One save in a fresh process, into an empty directory beside the checkpoint."""
    got = child_json(SAVE % SAVERS[saver], d, _save_out(d))
    got["gb_s"] = got["bytes"] / got["seconds"] / GB
    return got


def fio_write_pass(fio, d, bs="4M"):
    """fio writing as many bytes in as many files as the checkpoint's, O_DIRECT, io_uring at depth 32, each file
    synced at its end (--end_fsync): the disk's durable sequential write rate."""
    out = _save_out(d)
    os.makedirs(out)
    files = sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".safetensors"))
    args = [fio, "--output-format=json", "--ioengine=io_uring", "--direct=1", "--rw=write", f"--bs={bs}",
            "--iodepth=32", "--end_fsync=1", "--group_reporting"]
    for i, f in enumerate(files):
        size = os.path.getsize(f) // (4 << 20) * (4 << 20)
        args += [f"--name=w{i}", f"--filename={os.path.join(out, f'f{i}')}", f"--size={size}"]
    t0 = time.perf_counter()
    res = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    secs = time.perf_counter() - t0
    j = json.loads(res[res.index("{"):])["jobs"][0]
    return {"gb_s": j["write"]["io_bytes"] / secs / GB, "bytes": j["write"]["io_bytes"], "seconds": secs}


def link_pass(d):
    """The host-to-GPU link's rate on the same bytes: the files already in pinned memory, copied to the GPU
    (no loader delivers a warm checkpoint faster)."""
    out = subprocess.run([sys.executable, "-c", LINK, d], capture_output=True, text=True, check=True).stdout
    n, secs = out.split()
    return {"gb_s": int(n) / float(secs) / GB, "bytes": int(n), "seconds": float(secs)}


def fio_pass(fio, d, direct=1, bs="4M", regions=1):
    """fio reading every shard once, io_uring, BS, the files at once, O_DIRECT or not: each file as one run at
    depth 32, or cut into REGIONS runs side by side at depth 32/REGIONS each (16 MiB-aligned cuts)."""
    files = sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".safetensors"))
    args = [fio, "--output-format=json", "--ioengine=io_uring", f"--direct={direct}", "--rw=read", f"--bs={bs}",
            f"--iodepth={max(1, 32 // regions)}", "--group_reporting"]
    for i, f in enumerate(files):
        size, step = os.path.getsize(f), 16 << 20
        cut = -(-size // regions // step) * step
        for k in range(regions):
            off = k * cut
            if off < size:
                args += [f"--name=f{i}r{k}", f"--filename={f}", f"--offset={off}", f"--size={min(cut, size - off)}"]
    t0 = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    secs = time.perf_counter() - t0
    j = json.loads(out[out.index("{"):])["jobs"][0]
    return {"gb_s": j["read"]["io_bytes"] / secs / GB, "bytes": j["read"]["io_bytes"], "seconds": secs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp/sluice-ckpt")
    ap.add_argument("--shape", default="llama8b")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--modes", default="cold,warm")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="comma list of contenders (default: all)")
    ap.add_argument("--fio", default="", help="fio binary: cold reference")
    ap.add_argument("--fio-bs", default="4M", help="fio's read sizes, as 4M,16M (4M: the contender 'fio')")
    ap.add_argument("--fio-regions", default="1", help="fio's runs side by side a file, as 1,8 (1: the contender 'fio')")
    ap.add_argument("--link", action="store_true", help="warm: also the host-to-GPU copy of the files from pinned memory")
    ap.add_argument("--fio-buffered", action="store_true", help="also fio through the page cache, 16 MiB reads")
    ap.add_argument("--out", default="ckpt_bench.json")
    ap.add_argument("--tp", default="0/1", help="RANK/WORLD: that tensor-parallel rank's slices (safetensors, sluice)")
    ap.add_argument("--ranks", type=int, default=1, help="processes, one a GPU, each loading every tensor onto its GPU")
    ap.add_argument("--make-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    d = os.path.join(a.dir, f"{a.shape}-{a.layers}")
    os.makedirs(d, exist_ok=True)
    rank, world = (int(x) for x in a.tp.split("/"))
    if a.make_only:
        return make(d, a.shape, a.layers, (rank, world))
    # Made in a child, so this process holds no CUDA context or memory while the loaders run.
    subprocess.run([sys.executable, __file__, "--make-only", "--dir", a.dir, "--shape", a.shape, "--layers",
                    str(a.layers), "--tp", a.tp], check=True)
    size = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".safetensors"))
    res = Results(a.out, shape=a.shape, layers=a.layers, bytes=size, reps=a.reps, tp=a.tp, ranks=a.ranks)
    names = [v for v in VARIANTS if (not a.only or v in a.only.split(",")) and (world == 1 or VARIANTS[v][0] in TP_LOADERS)
             and (a.ranks > 1 or not VARIANTS[v][1].get("group"))]
    for mode in a.modes.split(","):
        contenders = {v: (lambda v=v: one_pass(d, v, a.tp, a.ranks)) for v in names}
        if mode == "save":
            contenders = {v: (lambda v=v: save_pass(d, v)) for v in SAVERS if not a.only or v in a.only.split(",")}
            if a.fio:
                contenders["fio write"] = lambda: fio_write_pass(a.fio, d)
        if mode == "cold" and a.fio:
            for bs in a.fio_bs.split(","):
                for k in (int(x) for x in a.fio_regions.split(",")):
                    name = "fio" + ("" if bs == "4M" else f" bs={bs}") + ("" if k == 1 else f" regions={k}")
                    contenders[name] = lambda bs=bs, k=k: fio_pass(a.fio, d, 1, bs, k)
        if mode == "warm" and a.link:
            contenders["link: pinned host to GPU"] = lambda: link_pass(d)
        if mode == "cold" and a.fio and a.fio_buffered:
            contenders["fio buffered 16M"] = lambda: fio_pass(a.fio, d, 0, "16M")
        got = side_by_side(contenders, a.reps, before=drop_caches if mode in ("cold", "save") else (lambda: warm(d)))
        res[mode] = got
        for name, r in got.items():
            print(f"[ckpt] {mode:4s} {name:32s} " + (f"{r['gb_s']:6.2f} GB/s ({min(r['passes']):.2f}-"
                  f"{max(r['passes']):.2f}), {r.get('cpu_s_per_gb', 0):.2f} CPU s/GB" + (
                  f", call returned at {r['returned_s'] * 1e3:.0f} of {r['seconds'] * 1e3:.0f} ms" if "returned_s" in r
                  else "") if "error" not in r
                  else f"error: {r['error'][:160]}"), flush=True)


if __name__ == "__main__":
    main()
