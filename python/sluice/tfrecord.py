"""TFRecord datasets read in place (sluice.Dataset("train.tfrecord") or a directory of them: one field, "record",
each record's bytes, CRC-checked as it is read), and tf_example, which decodes a serialized tf.train.Example
without TensorFlow or protobuf."""
import struct

import numpy as np


def _varint(b, at, end):
    v = shift = 0
    while True:
        if at >= end or shift > 63:
            raise ValueError(f"tf_example: a varint cut short or over 10 bytes at offset {at}")
        c = b[at]
        at += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, at


def _fields(b, at, end):
    """(field number, wire type, value) of each field of the message b[at:end]: value an int (varint), or the
    (start, end) of a length-delimited or fixed field."""
    while at < end:
        key, at = _varint(b, at, end)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, at = _varint(b, at, end)
            yield num, wt, v
        elif wt == 2:
            n, at = _varint(b, at, end)
            if n > end - at:
                raise ValueError(f"tf_example: a field of {n} bytes runs past its message at offset {at}")
            yield num, wt, (at, at + n)
            at += n
        elif wt in (1, 5):
            n = 8 if wt == 1 else 4
            if n > end - at:
                raise ValueError(f"tf_example: a fixed field cut short at offset {at}")
            yield num, wt, (at, at + n)
            at += n
        else:
            raise ValueError(f"tf_example: wire type {wt} at offset {at} (not a tf.train.Example)")


def _signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def _feature(b, start, end):
    """A Feature's values: a list of bytes, a float32 array or an int64 array."""
    for num, wt, v in _fields(b, start, end):
        if num == 1 and wt == 2:  # BytesList
            return [bytes(b[s:e]) for n, w, (s, e) in _fields(b, *v) if n == 1 and w == 2]
        if num == 2 and wt == 2:  # FloatList: packed, or one float at a time
            out = []
            for n, w, x in _fields(b, *v):
                if n == 1 and w == 2:
                    s, e = x
                    if (e - s) % 4:
                        raise ValueError(f"tf_example: packed floats of {e - s} bytes at offset {s}")
                    out += struct.unpack(f"<{(e - s) // 4}f", bytes(b[s:e]))
                elif n == 1 and w == 5:
                    out += struct.unpack("<f", bytes(b[x[0]:x[1]]))
            return np.array(out, dtype=np.float32)
        if num == 3 and wt == 2:  # Int64List: packed varints, or one at a time
            out = []
            for n, w, x in _fields(b, *v):
                if n == 1 and w == 2:
                    at, e = x
                    while at < e:
                        u, at = _varint(b, at, e)
                        out.append(_signed(u))
                elif n == 1 and w == 0:
                    out.append(_signed(x))
            return np.array(out, dtype=np.int64)
    return []


def tf_example(record):
    """The features of a serialized tf.train.Example (bytes, a memoryview or a uint8 array: a TFRecord dataset's
    "record" field) as {name: values}: a bytes_list as a list of bytes, a float_list as a float32 array, an
    int64_list as an int64 array.  Bytes that are not an Example raise ValueError naming the offset."""
    b = memoryview(np.ascontiguousarray(record, dtype=np.uint8) if isinstance(record, np.ndarray) else record)
    b = b.cast("B")
    out = {}
    for num, wt, v in _fields(b, 0, len(b)):
        if num != 1 or wt != 2:
            continue
        for n, w, entry in _fields(b, *v):  # Features.feature: map<string, Feature>
            if n != 1 or w != 2:
                continue
            key, value = None, (0, 0)
            for kn, kw, kv in _fields(b, *entry):
                if kn == 1 and kw == 2:
                    key = bytes(b[kv[0]:kv[1]]).decode("utf-8", errors="replace")
                elif kn == 2 and kw == 2:
                    value = kv
            if key is not None:
                out[key] = _feature(b, *value)
    return out
