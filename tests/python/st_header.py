"""A safetensors file's header as the library reads it (sluice_st_header_read), for tests to look inside the files
sluice and its peers write: the package itself plans every load from the library's table (sluice_ckpt_*) and
parses no header."""
import ctypes as C
import json

from sluice._lib import check, lib, shown
from sluice._safetensors import open_file


def read_header(path, f=None):
    """(header dict, data start) of a safetensors file, read through the open handle f (path's; opened and closed
    here if None) and checked by the library as sluice_ckpt_open checks every file; a SluiceError naming the
    file and what is wrong otherwise."""
    if f is None:
        f = open_file(path, 0)
        try:
            return read_header(path, f)
        finally:
            lib.sluice_file_close(f)
    h = C.c_void_p()
    check(lib.sluice_st_header_read(C.byref(h), f, shown(path).encode()))
    try:
        n = C.c_size_t()
        raw = C.string_at(lib.sluice_st_header_json(h, C.byref(n)), n.value)
        return json.loads(raw), lib.sluice_st_header_data_start(h)
    finally:
        lib.sluice_st_header_free(h)
