"""Object storage: the S3 client by bucket and key, and copies between local paths and s3://."""
import ctypes as C
import errno

from ._lib import CopyReport, S3Object, SluiceError, check, cpath, lib, names_of, shown
from .buffers import Future, _buffer, _eng


def copy(src, dst, recursive=False, symlinks=False, follow_symlinks=False):
    """Copies between a local path and s3:// either way, as `sluice cp` does (a file, or with recursive a
    whole directory or prefix); returns {"files", "bytes", "seconds", "files_verified", "checksum", "skipped"}:
    the downloads matched against their object's checksum, and which algorithm (or why none was); the links and
    special files of a local tree left out. A local tree's links are decided as `sluice pack --from-dir`
    decides them: one inside the tree is copied as the file it leads to (symlinks=True: kept a link, as
    shutil.copytree's symlinks=True keeps it, made relative; only into a local destination), one leading out
    of it is skipped and named on stderr unless follow_symlinks=True (`sluice cp -L`), which copies it as
    its target."""
    rep = CopyReport()
    flags = (1 if recursive else 0) | (2 if symlinks else 0) | (4 if follow_symlinks else 0)
    check(lib.sluice_copy(cpath(src), cpath(dst), flags, C.byref(rep)))
    return {"files": rep.files, "bytes": rep.bytes, "seconds": rep.seconds, "files_verified": rep.files_verified,
            "checksum": rep.checksum.decode(errors="replace"), "skipped": rep.skipped}


def listdir(path, recursive=False):
    """The regular files directly in path (a local directory or an s3:// prefix: its objects), or with recursive
    every one below it: full paths, sorted."""
    return names_of(lib.sluice_list, cpath(path), int(recursive))


def remove(path):
    """Removes a file or an s3:// object."""
    check(lib.sluice_remove(cpath(path)))


def _b(s):
    return None if s is None else s.encode()


_DONE_CB = C.CFUNCTYPE(None, C.c_ssize_t, C.c_void_p)


class Client:
    """An S3-compatible store, by bucket and key, on the process's engine (any path argument of sluice may also
    be s3://BUCKET/KEY, with settings from the AWS_* environment and ~/.aws files).  endpoint, access_key,
    secret_key, region: None to take each the same way; a key pair given here wins.  The knobs, under the
    engine's names (buffer_pool_size, max_transfer_size: each ranged GET's size, queue_depth, threads: the GETs
    in flight, device_ids: the GPUs its engine serves, enable_p2p), give the client an engine of its own with
    those settings."""

    _h = None  # set once the C client is open; close() and __del__ look at it

    def __init__(self, endpoint=None, access_key=None, secret_key=None, region=None, buffer_pool_size=None,
                 max_transfer_size=None, queue_depth=None, threads=None, device_ids=None, enable_p2p=None):
        h = C.c_void_p()
        knobs = {"buffer_pool_size": buffer_pool_size, "max_transfer_size": max_transfer_size,
                 "queue_depth": queue_depth, "threads": threads, "enable_p2p": enable_p2p}
        if device_ids is not None:
            ids = (C.c_int * len(device_ids))(*device_ids)
            knobs["device_ids"] = (ids, len(device_ids))
        if all(v is None for v in knobs.values()):
            check(lib.sluice_s3_open(C.byref(h), _eng(), _b(endpoint), _b(access_key), _b(secret_key), _b(region)))
        else:
            cfg = C.c_void_p()
            check(lib.sluice_config_new(C.byref(cfg)))
            try:
                for name, v in knobs.items():
                    if v is not None:
                        check(getattr(lib, "sluice_config_set_" + name)(cfg, *(v if isinstance(v, tuple) else (v,))))
                check(lib.sluice_s3_open_config(C.byref(h), cfg, _b(endpoint), _b(access_key), _b(secret_key),
                                                _b(region)))
            finally:
                lib.sluice_config_free(cfg)
        self._h = h

    def _async(self, write, bucket, key, buffer, offset, length, callback):
        ptr, n, keep = _buffer(buffer, not write)
        if length is not None:
            if length > n:
                raise ValueError(f"sluice: length {length} is larger than the buffer ({n} bytes)")
            n = length
        cb = _DONE_CB(lambda result, user: callback(result)) if callback else None
        fut = C.c_void_p()
        if write:
            check(lib.sluice_s3_write_async(self._h, bucket.encode(), key.encode(), ptr, n,
                                            C.cast(cb, C.c_void_p) if cb else None, None, C.byref(fut)))
        else:
            check(lib.sluice_s3_read_async(self._h, bucket.encode(), key.encode(), ptr, offset, n,
                                           C.cast(cb, C.c_void_p) if cb else None, None, C.byref(fut)))
        f = Future(fut, None, (buffer, keep, cb, self))
        return f

    def async_read(self, bucket, key, buffer, offset=0, length=None, callback=None):
        """Starts reading bucket/key into buffer (GPU or host) and returns a Future at once; .wait() gives the
        bytes read.  callback(result), if given, is called from a sluice thread when the read is done (result:
        bytes, or a negative error code).  Keep buffer alive until then."""
        return self._async(False, bucket, key, buffer, offset, length, callback)

    def async_write(self, bucket, key, buffer, callback=None):
        """Starts writing buffer as the whole object bucket/key; a Future, and callback(result), as async_read."""
        return self._async(True, bucket, key, buffer, 0, None, callback)

    def read_to_gpu(self, bucket, key, buffer, offset=0, length=None):
        """Reads length bytes (default: all of buffer) of bucket/key at offset into buffer (a GPU or host
        array); returns the bytes read."""
        ptr, n, keep = _buffer(buffer, True)
        if length is not None:
            if length > n:
                raise ValueError(f"sluice: length {length} is larger than the buffer ({n} bytes)")
            n = length
        return check(lib.sluice_s3_read_to_gpu(self._h, bucket.encode(), key.encode(), ptr, offset, n, None))

    def write_from_gpu(self, bucket, key, buffer):
        """Writes buffer (a GPU or host array) as the whole object bucket/key; returns the bytes written."""
        ptr, n, keep = _buffer(buffer, False)
        return check(lib.sluice_s3_write_from_gpu(self._h, bucket.encode(), key.encode(), ptr, n, None))

    def get_many(self, bucket, keys, max_size=1 << 20, in_flight=64, size_limit=1 << 30):
        """Whole objects of bucket, many GETs in flight on kept-alive connections (for a sample an object):
        their bytes as numpy uint8 arrays, in the order of keys, each checked against its length and the
        full-object checksum the server sends.  max_size: the bytes set aside for each; a larger object is read
        again at the size the server says, up to size_limit (default 1 GiB): past it, SluiceError (-EFBIG)
        naming the object, before anything is allocated for it.  Raises SluiceError naming the first object
        that failed."""
        import numpy as np
        n = len(keys)
        enc = [k.encode() for k in keys]
        buf = np.empty(max(1, n * max_size), np.uint8)
        objs = (S3Object * max(1, n))()
        base = buf.ctypes.data
        for i, k in enumerate(enc):
            objs[i].key, objs[i].buf, objs[i].cap = k, base + i * max_size, max_size
        lib.sluice_s3_get_many(self._h, bucket.encode(), objs, n, in_flight)
        detail = lib.sluice_last_error_detail().decode(errors="replace")
        big = [i for i in range(n) if objs[i].result == -errno.EFBIG and objs[i].size > max_size]
        bad = [i for i in range(n) if objs[i].result < 0 and i not in big]
        if bad:
            i = bad[0]
            raise SluiceError(objs[i].result, detail if keys[i] in detail else f"s3://{bucket}/{keys[i]}: {detail}")
        huge = [i for i in big if objs[i].size > size_limit]
        if huge:  # the size is the server's word: bounded before it becomes an allocation
            i = huge[0]
            raise SluiceError(-errno.EFBIG, f"s3://{bucket}/{keys[i]}: the server says {objs[i].size} bytes, over "
                                            f"get_many's size_limit of {size_limit}")
        out = [buf[i * max_size:i * max_size + max(0, objs[i].result)] for i in range(n)]
        for i in big:  # larger than max_size: once more, at its size
            out[i] = np.empty(objs[i].size, np.uint8)
            one = (S3Object * 1)()
            one[0].key, one[0].buf, one[0].cap = enc[i], out[i].ctypes.data, objs[i].size
            check(lib.sluice_s3_get_many(self._h, bucket.encode(), one, 1, 1))
        return out

    def size(self, bucket, key):
        """The object's size in bytes."""
        out = C.c_uint64()
        check(lib.sluice_s3_size(self._h, bucket.encode(), key.encode(), C.byref(out)))
        return out.value

    def close(self):
        """Closes the client; transfers still running must be waited for first."""
        if self._h:
            lib.sluice_s3_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


class ObjectFolder:
    """Samples stored an object each under an s3:// prefix in ImageFolder's layout (PREFIX/CLASS/NAME), read
    without converting them first.  Labels are the classes' indices in sorted order, as torchvision's
    ImageFolder gives them; objects directly under the prefix (no class) are left out.  Iterating yields
    batches (a list of numpy uint8 arrays, a numpy int64 array of labels) in the listing's order, or shuffled
    each epoch (set_epoch) with seed; the next batch's GETs are in flight while the current one is used.
    in_flight: GETs at a time; max_size: bytes set aside for each object (a larger one is read again at its
    size); client: a sluice.Client (default: the AWS_* environment's)."""

    def __init__(self, url, batch_size=64, shuffle=False, seed=0, drop_last=False, in_flight=64, max_size=1 << 20,
                 client=None):
        if not url.startswith("s3://"):
            raise ValueError(f"sluice.ObjectFolder: {shown(url)!r} is not an s3:// prefix")
        self.bucket, _, prefix = url[5:].partition("/")
        prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        base = f"s3://{self.bucket}/"
        rels = [p[len(base) + len(prefix):] for p in listdir(base + prefix, recursive=True)]
        self.classes = sorted({r.split("/", 1)[0] for r in rels if "/" in r})
        index = {c: i for i, c in enumerate(self.classes)}
        self.samples = [(prefix + r, index[r.split("/", 1)[0]]) for r in rels if "/" in r]
        if not self.samples:
            raise ValueError(f"sluice.ObjectFolder: no objects in class folders under {shown(url)}")
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.in_flight, self.max_size, self.epoch = in_flight, max_size, 0
        self.client = client or Client()

    def __len__(self):
        n = len(self.samples)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch):
        """With shuffle, the order of the next iteration (seed and epoch)."""
        self.epoch = epoch

    def _batches(self):
        import numpy as np
        order = np.arange(len(self.samples))
        if self.shuffle:
            order = np.random.default_rng((self.seed, self.epoch)).permutation(order)
        for b in range(len(self)):
            yield [self.samples[i] for i in order[b * self.batch_size:(b + 1) * self.batch_size]]

    def _get(self, batch):
        import numpy as np
        data = self.client.get_many(self.bucket, [k for k, _ in batch], self.max_size, self.in_flight)
        return data, np.array([label for _, label in batch], np.int64)

    def __iter__(self):
        return _ahead(self._get, self._batches())


def _ahead(fn, items):
    """fn(item) of each item in order, the next one's call running on a thread while this one's result is
    used (the library's calls let go of the GIL)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as pool:
        ahead = None
        for item in items:
            nxt = pool.submit(fn, item)
            if ahead is not None:
                yield ahead.result()
            ahead = nxt
        if ahead is not None:
            yield ahead.result()
