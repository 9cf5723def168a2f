"""TFRecord datasets read in place (sluice.Dataset("train.tfrecord") or a directory of them: one field, "record",
each record's bytes, CRC-checked as it is read), and tf_example, which decodes a serialized tf.train.Example
without TensorFlow or protobuf."""
import struct

import numpy as np


_M64 = (1 << 64) - 1


def _varint(b, at, end):
    """A varint at b[at:end] (at most 10 bytes, kept to its low 64 bits, as protobuf does) and where it ends."""
    v = shift = 0
    while True:
        if at >= end or shift > 63:
            raise ValueError(f"tf_example: a varint cut short or over 10 bytes at offset {at}")
        c = b[at]
        at += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v & _M64, at


def _skip_group(b, at, end, num):
    """Past the end of the group field num opened before at (wire types 3 and 4: skipped, as protobuf does)."""
    while True:
        if at >= end:
            raise ValueError(f"tf_example: group {num} not closed")
        key, at = _varint(b, at, end)
        n, wt = key >> 3, key & 7
        if wt == 4:
            if n != num:
                raise ValueError(f"tf_example: group {num} closed as {n} at offset {at}")
            return at
        at = _skip(b, at, end, n, wt)


def _skip(b, at, end, num, wt):
    if wt == 0:
        return _varint(b, at, end)[1]
    if wt in (1, 5):
        n = 8 if wt == 1 else 4
    elif wt == 2:
        n, at = _varint(b, at, end)
    elif wt == 3:
        return _skip_group(b, at, end, num)
    else:
        raise ValueError(f"tf_example: wire type {wt} at offset {at} (not a tf.train.Example)")
    if n > end - at:
        raise ValueError(f"tf_example: a field of {n} bytes runs past its message at offset {at}")
    return at + n


def _fields(b, at, end):
    """(field number, wire type, value) of each field of the message b[at:end]: value an int (varint), or the
    (start, end) of a length-delimited or fixed field; groups are skipped."""
    while at < end:
        key, at = _varint(b, at, end)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, at = _varint(b, at, end)
            yield num, wt, v
        elif wt in (1, 2, 5):
            n = 8 if wt == 1 else 4
            if wt == 2:
                n, at = _varint(b, at, end)
            if n > end - at:
                raise ValueError(f"tf_example: a field of {n} bytes runs past its message at offset {at}")
            yield num, wt, (at, at + n)
            at += n
        elif wt == 3:
            at = _skip_group(b, at, end, num)
        else:
            raise ValueError(f"tf_example: wire type {wt} at offset {at} (not a tf.train.Example)")


def _packed_varints(b, start, end):
    """The varints packed in b[start:end] as int64 (each kept to its low 64 bits, two's complement), decoded at
    once: a varint ends at its first byte under 0x80, and holds 7 bits a byte, low first."""
    a = np.frombuffer(b, np.uint8, end - start, start)
    ends = np.flatnonzero(a < 0x80)
    if len(a) and (not len(ends) or ends[-1] != len(a) - 1):
        raise ValueError(f"tf_example: a varint cut short at offset {start + (ends[-1] + 1 if len(ends) else 0)}")
    starts = np.concatenate(([0], ends[:-1] + 1)) if len(ends) else ends
    lens = ends - starts + 1
    if len(lens) and lens.max() > 10:
        raise ValueError(f"tf_example: a varint over 10 bytes at offset {start + int(starts[lens.argmax()])}")
    if not len(ends):
        return np.zeros(0, np.int64)
    shift = (np.arange(len(a)) - np.repeat(starts, lens)).astype(np.uint64) * np.uint64(7)
    bits = (a & 0x7F).astype(np.uint64) << shift  # the 10th byte's bits past the 64th drop, as protobuf drops them
    return np.bitwise_or.reduceat(bits, starts).view(np.int64)


def _signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def _values(b, kind, start, end):
    """The values of one BytesList, FloatList or Int64List message: packed or one at a time, as protobuf takes."""
    out = []
    for n, w, x in _fields(b, start, end):
        if n != 1:
            continue
        if kind == "bytes" and w == 2:
            out.append(bytes(b[x[0]:x[1]]))
        elif kind == "float" and w == 2:
            if (x[1] - x[0]) % 4:
                raise ValueError(f"tf_example: packed floats of {x[1] - x[0]} bytes at offset {x[0]}")
            out += struct.unpack(f"<{(x[1] - x[0]) // 4}f", bytes(b[x[0]:x[1]]))
        elif kind == "float" and w == 5:
            out += struct.unpack("<f", bytes(b[x[0]:x[1]]))
        elif kind == "int64" and w == 2:
            out += _packed_varints(b, *x).tolist()
        elif kind == "int64" and w == 0:
            out.append(_signed(x))
    return out


_KINDS = {1: "bytes", 2: "float", 3: "int64"}


def _feature(b, spans, into):
    """A Feature given by one or more (start, end) spans (protobuf merges them), merged into into: the kind set
    last wins (a oneof), and lists of the kind kept are concatenated (repeated fields merge)."""
    kind, vals = into if into else (None, [])
    for start, end in spans:
        for num, wt, v in _fields(b, start, end):
            if num in _KINDS and wt == 2:
                new = _values(b, _KINDS[num], *v)
                kind, vals = (_KINDS[num], vals + new) if kind == _KINDS[num] else (_KINDS[num], new)
    return kind, vals


def _as_array(kind, vals):
    return vals if kind in (None, "bytes") else np.array(vals, dtype=np.float32 if kind == "float" else np.int64)


def tf_example(record):
    """The features of a serialized tf.train.Example (bytes, a memoryview or a uint8 array: a TFRecord dataset's
    "record" field) as {name: values}: a bytes_list as a list of bytes, a float_list as a float32 array, an
    int64_list as an int64 array, decoded as protobuf decodes it (repeated Features and lists merged, the last
    of a oneof kept, unknown fields skipped).  Bytes that are not an Example, or a key that is not UTF-8, raise
    ValueError naming the offset."""
    b = memoryview(np.ascontiguousarray(record, dtype=np.uint8) if isinstance(record, np.ndarray) else record)
    b = b.cast("B")
    feats = {}
    for num, wt, v in _fields(b, 0, len(b)):
        if num != 1 or wt != 2:
            continue
        for n, w, entry in _fields(b, *v):  # Features.feature: map<string, Feature>
            if n != 1 or w != 2:
                continue
            key, spans = b"", []
            for kn, kw, kv in _fields(b, *entry):
                if kn == 1 and kw == 2:
                    key = bytes(b[kv[0]:kv[1]])
                elif kn == 2 and kw == 2:
                    spans.append(kv)
            try:
                name = key.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"tf_example: a feature name that is not UTF-8 at offset {entry[0]}") from None
            feats[name] = _feature(b, spans, None)  # a key given again: its last entry wins, as in a map
    return {k: _as_array(kind, vals) for k, (kind, vals) in feats.items()}
