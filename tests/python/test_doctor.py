"""sluice doctor on faked /proc and /sys trees (SLUICE_SYSROOT): every check's every verdict, with its value."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice"))
GPU = "0000:17:00.0"


class Machine:
    """A healthy GPU machine's procfs and sysfs, under tmp/root; data under tmp/data on disk vdz."""

    def __init__(self, tmp):
        self.root = tmp / "root"
        self.data = tmp / "data"
        self.data.mkdir()
        st = os.stat(self.data)
        self.majmin = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        w = self.w
        for k, v in {"vendor": "0x10de", "class": "0x030200", "numa_node": "0", "current_link_speed": "32.0 GT/s PCIe",
                     "max_link_speed": "32.0 GT/s PCIe", "current_link_width": "16", "max_link_width": "16"}.items():
            w(f"sys/bus/pci/devices/{GPU}/{k}", v)
        w("sys/bus/pci/devices/0000:00:1f.0/vendor", "0x8086")  # not a GPU
        w("sys/bus/pci/devices/0000:00:1f.0/class", "0x060100")
        w("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct 2 2025")
        w("proc/driver/nvidia-fs/version", "2.26")
        w("sys/devices/system/node/node0/cpulist", "0-15")
        w("proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/vdz1 ro")
        w("proc/sys/kernel/osrelease", "6.8.0-49-generic")
        w("proc/sys/kernel/io_uring_disabled", "0")
        w("proc/self/status", "Name:\tsluice\nSeccomp:\t0\nCapEff:\t0000000000000000\n")
        w("proc/self/limits", "Limit                     Soft Limit           Hard Limit           Units\n"
          "Max locked memory         unlimited            unlimited            bytes\n")
        w("proc/self/cgroup", "0::/job\n")
        w("sys/fs/cgroup/job/memory.max", "max")
        w("sys/fs/cgroup/job/io.max", "")
        w("proc/self/mountinfo", "1 0 0:30 / / rw,relatime - overlay overlay rw\n"
          f"36 1 {self.majmin} / {os.path.realpath(self.data)} rw,relatime shared:1 - ext4 /dev/vdz1 rw\n")
        os.makedirs(self.root / "sys/dev/block")
        os.symlink("../../block/vdz/vdz1", self.root / "sys/dev/block" / self.majmin)
        w("sys/block/vdz/vdz1/partition", "1")
        w("sys/block/vdz/dev", "253:0")
        w("sys/block/vdz/device/numa_node", "0")
        for k, v in {"scheduler": "[none] mq-deadline", "rotational": "0", "read_ahead_kb": "4096",
                     "nr_requests": "1023", "max_sectors_kb": "1280", "max_hw_sectors_kb": "1280"}.items():
            w(f"sys/block/vdz/queue/{k}", v)
        w("sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never")
        w("proc/meminfo", "MemTotal: 131072000 kB\nHugePages_Total:       0\n")
        for c in range(2):
            w(f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor", "performance")

    def w(self, rel, text):
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")

    def rm(self, rel):
        p = self.root / rel
        if p.is_dir():
            import shutil
            shutil.rmtree(p)
        else:
            p.unlink()

    def run(self, path=None):
        env = dict(os.environ, SLUICE_SYSROOT=str(self.root), SLUICE_CONFIG="", SLUICE_THREADS="4",
                   SLUICE_QUEUE_DEPTH="4", SLUICE_MAX_TRANSFER_SIZE="4M")
        r = subprocess.run([SLUICE, "doctor", "--json", str(path or self.data)], capture_output=True, text=True,
                           env=env)
        assert r.returncode in (0, 1), r.stderr
        out = json.loads(r.stdout)
        checks = {}
        for c in out["checks"]:
            checks.setdefault(c["name"], []).append(c)
        assert out["fail"] == sum(c["verdict"] == "fail" for c in out["checks"])
        assert r.returncode == (1 if out["fail"] else 0)
        return checks


@pytest.fixture
def machine(tmp_path):
    return Machine(tmp_path)


def test_healthy_machine_all_ok(machine):
    checks = machine.run()
    names = ["gpu", "gds", "pcie_link", "filesystem", "numa", "iommu", "io_uring", "memlock", "cgroup", "scheduler",
             "read_ahead_kb", "nr_requests", "max_sectors_kb", "hugepages", "cpu_governor"]
    assert list(checks) == names
    bad = [c for cs in checks.values() for c in cs if c["verdict"] != "ok"]
    assert not bad, bad
    assert checks["gpu"][0]["value"] == f"1 NVIDIA GPU ({GPU}), driver 580.159.04"
    # The open kernel module words its version line otherwise.
    machine.w("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  "
              "Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:55:41 UTC 2025")
    assert machine.run()["gpu"][0]["value"] == f"1 NVIDIA GPU ({GPU}), driver 580.95.05"
    assert checks["pcie_link"][0]["value"] == f"{GPU}: Gen5 x16 (the device's maximum Gen5 x16)"
    assert checks["filesystem"][0]["value"].endswith(f": ext4 on /dev/vdz1 at {os.path.realpath(machine.data)} (rw,relatime)")
    assert checks["numa"][0]["value"] == f"1 node; GPU {GPU} on node 0; vdz on node 0 (-1: not reported)"
    assert checks["scheduler"][0]["value"] == "vdz: none (solid state)"
    assert checks["max_sectors_kb"][0]["value"] == "vdz: 1280 KiB (hardware 1280 KiB)"
    assert checks["memlock"][0]["value"] == "unlimited against a pinned pool of 64.0 MiB"
    assert checks["cpu_governor"][0]["value"] == "2 of 2 CPUs on performance"
    for cs in checks.values():
        assert all(c["why"] and c["fix"] == "" for c in cs)


# (what to change, check, verdict, text the value holds, text the fix holds)
CASES = [
    ("no_gpu", lambda m: m.rm("sys/bus/pci/devices/" + GPU), "gpu", "warn", "no NVIDIA GPU", "NVIDIA GPU"),
    ("no_driver", lambda m: m.rm("proc/driver/nvidia"), "gpu", "fail", "no driver loaded", "modprobe nvidia"),
    ("no_nvidia_fs", lambda m: m.rm("proc/driver/nvidia-fs"), "gds", "warn", "nvidia-fs is not loaded", "modprobe nvidia-fs"),
    ("link_idle", lambda m: m.w(f"sys/bus/pci/devices/{GPU}/current_link_speed", "2.5 GT/s PCIe"), "pcie_link", "warn",
     "Gen1 x16 (the device's maximum Gen5 x16)", "under load"),
    ("link_narrow", lambda m: m.w(f"sys/bus/pci/devices/{GPU}/current_link_width", "8"), "pcie_link", "fail",
     "Gen5 x8 (the device's maximum Gen5 x16)", "x16 slot"),
    ("link_virtual", lambda m: m.w(f"sys/bus/pci/devices/{GPU}/current_link_speed", "Unknown"), "pcie_link", "ok",
     "not reported", ""),
    ("nfs", lambda m: m.w("proc/self/mountinfo", f"36 1 0:50 / {os.path.realpath(m.data)} rw,relatime - nfs4 srv:/d rw"),
     "filesystem", "warn", "nfs4 on srv:/d", "nconnect"),
    ("fuse", lambda m: m.w("proc/self/mountinfo", f"36 1 0:50 / {os.path.realpath(m.data)} rw,relatime - fuse.s3fs s3fs rw"),
     "filesystem", "warn", "fuse.s3fs", "FUSE"),
    ("overlay", lambda m: m.w("proc/self/mountinfo", "1 0 0:30 / / rw,relatime - overlay overlay rw"),
     "filesystem", "warn", "overlay on overlay at /", "volume"),
    ("atime", lambda m: m.w("proc/self/mountinfo", f"36 1 0:50 / {os.path.realpath(m.data)} rw - ext4 /dev/vdz1 rw"),
     "filesystem", "warn", "(rw)", "remount,noatime"),
    ("sync", lambda m: m.w("proc/self/mountinfo", f"36 1 0:50 / {os.path.realpath(m.data)} rw,sync,noatime - xfs /dev/vdz1 rw"),
     "filesystem", "warn", "(rw,sync,noatime)", "remount,async"),
    ("numa_split", lambda m: (m.w("sys/devices/system/node/node1/cpulist", "16-31"),
                              m.w(f"sys/bus/pci/devices/{GPU}/numa_node", "1")),
     "numa", "warn", "2 nodes; GPU 0000:17:00.0 on node 1; vdz on node 0", "numactl --cpunodebind=1"),
    ("iommu_on", lambda m: m.w("sys/class/iommu/dmar0/x", ""), "iommu", "warn", "1 unit, translating", "iommu=pt"),
    ("iommu_pt", lambda m: (m.w("sys/class/iommu/dmar0/x", ""), m.w("proc/cmdline", "ro intel_iommu=on iommu=pt")),
     "iommu", "ok", "passthrough", ""),
    ("uring_off", lambda m: m.w("proc/sys/kernel/io_uring_disabled", "2"), "io_uring", "fail", "io_uring_disabled=2",
     "kernel.io_uring_disabled=0"),
    ("uring_group", lambda m: m.w("proc/sys/kernel/io_uring_disabled", "1"), "io_uring", "warn", "io_uring_disabled=1",
     "io_uring_group"),
    ("old_kernel", lambda m: m.w("proc/sys/kernel/osrelease", "5.4.0-150-generic"), "io_uring", "fail", "kernel 5.4.0",
     "5.6 or later"),
    ("memlock_low", lambda m: m.w("proc/self/limits", "Max locked memory         65536                65536                bytes"),
     "memlock", "warn", "64.0 KiB against a pinned pool of 64.0 MiB", "ulimit -l unlimited"),
    ("memlock_cap", lambda m: (m.w("proc/self/limits", "Max locked memory         65536                65536                bytes"),
                               m.w("proc/self/status", "Seccomp:\t0\nCapEff:\t000001ffffffffff\n")),
     "memlock", "ok", "CAP_IPC_LOCK: not enforced", ""),
    ("cgroup_memory", lambda m: m.w("sys/fs/cgroup/job/memory.max", str(512 << 20)), "cgroup", "fail",
     "memory.max 512.0 MiB", "memory limit above 1.1 GiB"),
    ("cgroup_io", lambda m: m.w("sys/fs/cgroup/job/io.max", "253:0 rbps=104857600 wbps=max riops=max wiops=max"),
     "cgroup", "warn", "io.max rbps=104857600", "253:0 max rbps=max"),
    ("cgroup_other_disk", lambda m: m.w("sys/fs/cgroup/job/io.max", "259:0 rbps=1 wbps=max riops=max wiops=max"),
     "cgroup", "ok", "no limit on this disk", ""),
    ("bfq", lambda m: m.w("sys/block/vdz/queue/scheduler", "mq-deadline kyber [bfq] none"), "scheduler", "warn",
     "vdz: bfq (solid state)", "echo none | sudo tee /sys/block/vdz/queue/scheduler"),
    ("read_ahead", lambda m: m.w("sys/block/vdz/queue/read_ahead_kb", "32"), "read_ahead_kb", "warn", "vdz: 32 KiB",
     "/sys/block/vdz/queue/read_ahead_kb"),
    ("nr_requests", lambda m: m.w("sys/block/vdz/queue/nr_requests", "32"), "nr_requests", "warn", "vdz: 32",
     "echo 256"),
    ("max_sectors", lambda m: (m.w("sys/block/vdz/queue/max_sectors_kb", "128"),
                               m.w("sys/block/vdz/queue/max_hw_sectors_kb", "2048")),
     "max_sectors_kb", "warn", "vdz: 128 KiB (hardware 2048 KiB)", "echo 2048 | sudo tee /sys/block/vdz/queue/max_sectors_kb"),
    ("thp_never", lambda m: m.w("sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]"), "hugepages",
     "warn", "transparent never; 0 reserved", "madvise"),
    ("thp_never_reserved", lambda m: (m.w("sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]"),
                                      m.w("proc/meminfo", "HugePages_Total:    1024\n")),
     "hugepages", "ok", "1024 reserved", ""),
    ("powersave", lambda m: m.w("sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "powersave"), "cpu_governor",
     "warn", "1 of 2 CPUs on performance, others powersave", "cpupower frequency-set -g performance"),
    ("no_cpufreq", lambda m: m.rm("sys/devices/system/cpu"), "cpu_governor", "ok", "not exposed", ""),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_verdict(machine, case):
    _, change, name, verdict, value, fix = case
    change(machine)
    checks = machine.run()
    got = checks[name][0]
    assert got["verdict"] == verdict, got
    assert value in got["value"], got
    assert fix in got["fix"], got
    # Only the changed check moves (a GPU gone also ends the checks about it).
    others = [c for n, cs in checks.items() if n != name for c in cs if c["verdict"] != "ok"]
    assert not others or case[0] in ("no_gpu",), others


def test_missing_path_fails_naming_it(machine, tmp_path):
    checks = machine.run(tmp_path / "nowhere")
    assert checks["filesystem"][0]["verdict"] == "fail"
    assert "No such file" in checks["filesystem"][0]["value"]


def test_text_output_and_usage(machine):
    env = dict(os.environ, SLUICE_SYSROOT=str(machine.root), SLUICE_CONFIG="")
    machine.w("sys/block/vdz/queue/read_ahead_kb", "16")
    r = subprocess.run([SLUICE, "doctor", str(machine.data)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "read_ahead_kb" in ln and ln.startswith("warn"))
    assert "vdz: 16 KiB" in line
    assert "fix: echo 1024 | sudo tee /sys/block/vdz/queue/read_ahead_kb" in r.stdout
    assert r.stdout.rstrip().endswith("14 ok, 1 warn, 0 fail")
    r = subprocess.run([SLUICE, "doctor", "--bogus"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "--bogus" in r.stderr


# ---- a remote PATH: its endpoint asked once, and what failed named as curl names it

def _doctor_remote(path, **env):
    env = dict(os.environ, SLUICE_CONFIG="", SLUICE_S3_RETRIES="0", SLUICE_HTTP_RETRIES="0", **env)
    r = subprocess.run([SLUICE, "doctor", "--json", path], capture_output=True, text=True, env=env, timeout=120)
    out = json.loads(r.stdout)
    storage = [c for c in out["checks"] if c["name"] == "storage"]
    assert len(storage) == 1, out
    assert r.returncode == (1 if out["fail"] else 0), (r.returncode, out)
    return out, storage[0]


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


S3_ENV = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMIK7MDENG", "AWS_REGION": "us-east-1"}


@pytest.mark.parametrize("path,endpoint,curl,says,fix", [
    # Nothing listens on the port: refused.
    ("s3://bucket/data/", "http://127.0.0.1:{port}", "CURLE_COULDNT_CONNECT", "Connection refused", "nothing listens"),
    ("http://127.0.0.1:{port}/data.bin", None, "CURLE_COULDNT_CONNECT", "Connection refused", "nothing listens"),
    # RFC 6761: .invalid never resolves (a resolver answers it itself): a name, not a refusal.
    ("s3://bucket/data/", "http://nonexistent.invalid:9000", "CURLE_COULDNT_RESOLVE_HOST", "host name does not resolve",
     "does not resolve"),
    ("http://nonexistent.invalid/data.bin", None, "CURLE_COULDNT_RESOLVE_HOST", "host name does not resolve",
     "does not resolve"),
])
def test_an_endpoint_it_cannot_reach_is_a_fail_saying_what_failed(path, endpoint, curl, says, fix):
    port = _free_port()
    env = dict(S3_ENV, AWS_ENDPOINT_URL=endpoint.format(port=port)) if endpoint else {}
    out, st = _doctor_remote(path.format(port=port), **env)
    assert st["verdict"] == "fail" and out["fail"] >= 1, st
    assert curl in st["value"] and says in st["value"], st
    assert "Connection refused" not in st["value"] or curl == "CURLE_COULDNT_CONNECT", st
    assert fix in st["fix"], st
    if endpoint:
        assert f"(endpoint {endpoint.format(port=port)})" in st["value"], st


def test_an_endpoint_that_never_answers_is_a_timeout():
    import socket
    with socket.socket() as s:  # listens (the kernel completes the connection) and never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        out, st = _doctor_remote(f"http://127.0.0.1:{s.getsockname()[1]}/data.bin", SLUICE_HTTP_STALL_TIME="1")
    assert st["verdict"] == "fail", st
    assert "CURLE_OPERATION_TIMEDOUT" in st["value"] and "timed out" in st["value"], st
    assert "did not answer in time" in st["fix"], st


def test_a_reachable_endpoint_is_ok_and_a_missing_path_fails(s3):
    s3.put_object(Bucket="pytest", Key="doctor/x.bin", Body=b"x" * 1000)
    _, st = _doctor_remote("s3://pytest/doctor/")
    assert st["verdict"] == "ok" and "s3://pytest/doctor/: a directory at " + os.environ["AWS_ENDPOINT_URL"] in \
        st["value"], st
    _, st = _doctor_remote("s3://pytest/doctor/x.bin")
    assert st["verdict"] == "ok" and "a file of 1000 bytes" in st["value"], st
    _, st = _doctor_remote("s3://pytest/doctor/absent/")
    assert st["verdict"] == "fail" and "No such file" in st["value"] and "nothing is there" in st["fix"], st
    _, st = _doctor_remote("s3://")
    assert st["verdict"] == "fail" and "s3://BUCKET" in st["fix"], st


def test_a_presigned_urls_query_is_not_in_the_report():
    out, st = _doctor_remote(f"http://127.0.0.1:{_free_port()}/data.bin?X-Amz-Signature=s3cr3t")
    assert st["verdict"] == "fail"
    assert "s3cr3t" not in json.dumps(out), out
