"""Operating sluice: Prometheus metrics, and checkpoints of a CUDA process's GPU memory."""
import ctypes as C

from ._lib import CheckpointReport, check, lib


def metrics_text():
    """This process's figures (engine I/O, each open loader) in Prometheus's text format."""
    n = lib.sluice_metrics_text(None, 0) + 4096
    buf = C.create_string_buffer(n)
    lib.sluice_metrics_text(buf, n)
    return buf.value.decode()


def serve_metrics(port=0):
    """Serves metrics_text() at http://0.0.0.0:PORT/metrics (0: a free port; once per process, as
    SLUICE_METRICS_PORT does); returns the port."""
    bound = C.c_uint()
    check(lib.sluice_metrics_serve(port, C.byref(bound)))
    return bound.value


def checkpoint_process(pid, suspend=True, resume=True, timeout_ms=0):
    """Suspends the CUDA process pid (its GPU memory to host memory) and/or resumes it, through the driver's
    checkpoint functions; returns {"lock_s", "checkpoint_s", "restore_s", "unlock_s", "gpu_bytes", "state"}."""
    rep = CheckpointReport()
    check(lib.sluice_process_checkpoint(pid, (1 if suspend else 0) | (2 if resume else 0), timeout_ms, C.byref(rep)))
    return {"lock_s": rep.lock_s, "checkpoint_s": rep.checkpoint_s, "restore_s": rep.restore_s,
            "unlock_s": rep.unlock_s, "gpu_bytes": rep.gpu_bytes,
            "state": lib.sluice_process_state_name(rep.state).decode()}
